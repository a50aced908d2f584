//! The figures: line charts (one line per architecture), stacked in one file.
//!
//! Hand-written rather than `plotters`: a line chart is a few dozen elements. The layout is
//! drawn once ([`draw`]) through a [`Pen`]: [`svg`] writes it as SVG (the text left to the
//! viewer's fonts, plain text that diffs well when checked into `docs/`); a raster pen (the
//! CLI's PNG writer, with its bitmap font) draws the same layout in pixels.

use std::fmt::Write as _;

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend.
    pub name: String,
    /// Its points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The title above it.
    pub title: String,
    /// The x axis.
    pub x_label: String,
    /// The y axis.
    pub y_label: String,
    /// A logarithmic x axis (sizes, cores).
    pub log_x: bool,
    /// A logarithmic y axis (rates that span decades).
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

const W: f64 = 720.0;
const H: f64 = 380.0;
const L: f64 = 80.0;
const R: f64 = 170.0;
const T: f64 = 40.0;
const B: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" step for about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f < 1.5 {
        1.0
    } else if f < 3.0 {
        2.0
    } else if f < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// Where a text's `x` is: its start, middle or end (SVG's `text-anchor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// `x` is where the text starts.
    Start,
    /// `x` is its middle.
    Middle,
    /// `x` is where it ends.
    End,
}

/// A text to draw.
#[derive(Debug, Clone, Copy)]
pub struct Text<'a> {
    /// Where (the baseline's `y`; `x` as `anchor` says).
    pub at: (f64, f64),
    /// The text (unescaped).
    pub s: &'a str,
    /// Font size in pixels.
    pub size: f64,
    /// Where `at` is along it.
    pub anchor: Anchor,
    /// A title.
    pub bold: bool,
    /// Turned a quarter to the left (read bottom to top), about `at`.
    pub vertical: bool,
}

/// What a chart is drawn with; coordinates in the figure's pixels, `y` down, colors as RGB.
pub trait Pen {
    /// A straight line.
    fn line(&mut self, a: (f64, f64), b: (f64, f64), color: (u8, u8, u8), width: f64);
    /// A rectangle's outline.
    fn frame(&mut self, x: f64, y: f64, w: f64, h: f64, color: (u8, u8, u8));
    /// A text.
    fn text(&mut self, t: Text<'_>);
    /// A data point (`label` names it: series, x and y).
    fn dot(&mut self, at: (f64, f64), r: f64, color: (u8, u8, u8), label: &str);
    /// A series' line through `points`.
    fn polyline(&mut self, points: &[(f64, f64)], color: (u8, u8, u8), width: f64) {
        for w in points.windows(2) {
            self.line(w[0], w[1], color, width);
        }
    }
}

/// The figure's size for `charts` charts (width, height).
pub fn size(charts: usize) -> (f64, f64) {
    (W, H * charts.max(1) as f64)
}

fn rgb(hex: &str) -> (u8, u8, u8) {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0);
    ((v >> 16) as u8, (v >> 8) as u8, v as u8)
}

/// The series' colors, in order.
fn color(i: usize) -> (u8, u8, u8) {
    rgb(COLORS[i % COLORS.len()])
}

const AXIS: (u8, u8, u8) = (0x44, 0x44, 0x44);
const GRID: (u8, u8, u8) = (0xdd, 0xdd, 0xdd);

fn text(at: (f64, f64), s: &str, size: f64, anchor: Anchor) -> Text<'_> {
    Text {
        at,
        s,
        size,
        anchor,
        bold: false,
        vertical: false,
    }
}

fn chart(pen: &mut dyn Pen, c: &Chart, y0: f64) {
    let pts: Vec<(f64, f64)> = c.series.iter().flat_map(|s| s.points.clone()).collect();
    let xs = |x: f64| if c.log_x { x.max(1e-12).log10() } else { x };
    let (mut xmin, mut xmax) = pts
        .iter()
        .map(|p| xs(p.0))
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if pts.is_empty() {
        (xmin, xmax) = (0.0, 1.0);
    }
    if xmax <= xmin {
        xmax = xmin + 1.0;
    }
    let ymax_raw = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let ystep = nice_step(if ymax_raw > 0.0 { ymax_raw } else { 1.0 }, 5.0);
    let ymax = (ymax_raw / ystep).ceil().max(1.0) * ystep;
    // Log y: whole decades around the positive data.
    let ypos = pts.iter().map(|p| p.1).filter(|&y| y > 0.0);
    let dlo = ypos.clone().fold(f64::MAX, f64::min).log10().floor();
    let dhi = ypos.fold(f64::MIN, f64::max).log10().ceil().max(dlo + 1.0);
    let log_y = c.log_y && dlo.is_finite() && dhi.is_finite();
    let pw = W - L - R;
    let ph = H - T - B;
    let px = |x: f64| L + (xs(x) - xmin) / (xmax - xmin) * pw;
    let py = |y: f64| {
        let f = if log_y {
            (y.max(1e-12).log10() - dlo) / (dhi - dlo)
        } else {
            y / ymax
        };
        y0 + T + ph - f.clamp(-0.05, 1.05) * ph
    };
    pen.text(Text {
        bold: true,
        ..text((L, y0 + 24.0), &c.title, 15.0, Anchor::Start)
    });
    pen.frame(L, y0 + T, pw, ph, AXIS);
    // y ticks and grid.
    let yticks: Vec<f64> = if log_y {
        (dlo as i32..=dhi as i32).map(|d| 10f64.powi(d)).collect()
    } else {
        let mut t = vec![];
        let mut v = 0.0;
        while v <= ymax + ystep * 0.01 {
            t.push(v);
            v += ystep;
        }
        t
    };
    for v in yticks {
        let y = py(v);
        pen.line((L, y), (L + pw, y), GRID, 1.0);
        pen.text(text((L - 6.0, y + 4.0), &fmt_tick(v), 11.0, Anchor::End));
    }
    // x ticks: each distinct x of the data (log axes), or nice steps.
    let mut ticks: Vec<f64> = if c.log_x {
        let mut t: Vec<f64> = pts.iter().map(|p| p.0).collect();
        t.sort_by(|a, b| a.total_cmp(b));
        t.dedup();
        t
    } else {
        let step = nice_step(xmax - xmin, 6.0);
        let mut t = vec![];
        let mut x = (xmin / step).ceil() * step;
        while x <= xmax + step * 1e-6 {
            t.push(x);
            x += step;
        }
        t
    };
    if ticks.len() > 14 {
        let k = ticks.len().div_ceil(14);
        ticks = ticks.into_iter().step_by(k).collect();
    }
    let bottom = y0 + T + ph;
    for t in ticks {
        let x = px(t);
        pen.line((x, bottom), (x, bottom + 5.0), AXIS, 1.0);
        pen.text(text((x, bottom + 18.0), &fmt_tick(t), 11.0, Anchor::Middle));
    }
    pen.text(text(
        (L + pw / 2.0, y0 + H - 12.0),
        &c.x_label,
        12.0,
        Anchor::Middle,
    ));
    pen.text(Text {
        vertical: true,
        ..text((16.0, y0 + T + ph / 2.0), &c.y_label, 12.0, Anchor::Middle)
    });
    for (i, s) in c.series.iter().enumerate() {
        let col = color(i);
        let path: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (px(x), py(y))).collect();
        pen.polyline(&path, col, 2.0);
        for (&(x, y), &at) in s.points.iter().zip(&path) {
            let label = format!("{}: x={} y={}", s.name, trim(x), trim(y));
            pen.dot(at, 3.0, col, &label);
        }
        let ly = y0 + T + 10.0 + i as f64 * 18.0;
        pen.line((L + pw + 12.0, ly), (L + pw + 32.0, ly), col, 3.0);
        pen.text(text(
            (L + pw + 38.0, ly + 4.0),
            &s.name,
            12.0,
            Anchor::Start,
        ));
    }
}

/// Draws the charts one above the other with `pen` (a white figure of [`size`] assumed).
pub fn draw(charts: &[Chart], pen: &mut dyn Pen) {
    for (i, c) in charts.iter().enumerate() {
        chart(pen, c, i as f64 * H);
    }
}

/// Writes SVG elements.
struct SvgPen(String);

fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

impl Pen for SvgPen {
    fn line(&mut self, a: (f64, f64), b: (f64, f64), color: (u8, u8, u8), width: f64) {
        let w = if width == 1.0 {
            String::new()
        } else {
            format!(r#" stroke-width="{width}""#)
        };
        let _ = writeln!(
            self.0,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}"{w}/>"#,
            a.0,
            a.1,
            b.0,
            b.1,
            hex(color)
        );
    }
    fn frame(&mut self, x: f64, y: f64, w: f64, h: f64, color: (u8, u8, u8)) {
        let _ = writeln!(
            self.0,
            r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="{}"/>"#,
            hex(color)
        );
    }
    fn text(&mut self, t: Text<'_>) {
        let anchor = match t.anchor {
            Anchor::Start => "",
            Anchor::Middle => r#" text-anchor="middle""#,
            Anchor::End => r#" text-anchor="end""#,
        };
        let bold = if t.bold { r#" font-weight="bold""# } else { "" };
        let (x, y) = t.at;
        let turn = if t.vertical {
            format!(r#" transform="rotate(-90 {x:.1} {y:.1})""#)
        } else {
            String::new()
        };
        let _ = writeln!(
            self.0,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{}"{bold}{anchor}{turn}>{}</text>"#,
            t.size,
            esc(t.s)
        );
    }
    fn dot(&mut self, at: (f64, f64), r: f64, color: (u8, u8, u8), label: &str) {
        let _ = writeln!(
            self.0,
            r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{}"><title>{}</title></circle>"#,
            at.0,
            at.1,
            hex(color),
            esc(label)
        );
    }
    fn polyline(&mut self, points: &[(f64, f64)], color: (u8, u8, u8), width: f64) {
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            self.0,
            r#"<polyline fill="none" stroke="{}" stroke-width="{width}" points="{}"/>"#,
            hex(color),
            path.join(" ")
        );
    }
}

/// The charts one above the other, as an SVG document.
pub fn svg(charts: &[Chart]) -> String {
    let (w, h) = size(charts.len());
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut pen = SvgPen(s);
    draw(charts, &mut pen);
    let mut s = pen.0;
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_per_series_and_escapes_its_text() {
        let c = Chart {
            title: "a < b".into(),
            x_label: "cores".into(),
            y_label: "conn/s".into(),
            log_x: true,
            log_y: false,
            series: vec![
                Series {
                    name: "kernel".into(),
                    points: vec![(1.0, 10.0), (2.0, 15.0), (4.0, 18.0)],
                },
                Series {
                    name: "percore".into(),
                    points: vec![(1.0, 12.0), (2.0, 24.0), (4.0, 48.0)],
                },
            ],
        };
        let s = svg(&[c]);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 6);
        assert!(s.contains("a &lt; b") && !s.contains("a < b"));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(nice_step(48.0, 5.0), 10.0);
    }
}
