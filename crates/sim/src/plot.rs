//! The figures as SVG: line charts (one line per architecture), stacked in one file.
//!
//! Hand-written rather than `plotters`: a line chart is a few dozen SVG elements, the text is
//! left to the viewer's fonts (nothing to rasterise, no font files to find on a minimal
//! machine), and the output is plain text that diffs well when checked into `docs/`.

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

fn chart(out: &mut String, c: &Chart, y0: f64) {
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
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="15" font-weight="bold">{}</text>"#,
        L,
        y0 + 24.0,
        esc(&c.title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{L}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##,
        y0 + T
    );
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
        let _ = writeln!(
            out,
            r##"<line x1="{L}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            L + pw,
            L - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
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
    for t in ticks {
        let x = px(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#444"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            y0 + T + ph,
            y0 + T + ph + 5.0,
            y0 + T + ph + 18.0,
            fmt_tick(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
        L + pw / 2.0,
        y0 + H - 12.0,
        esc(&c.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="16" y="{:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        y0 + T + ph / 2.0,
        y0 + T + ph / 2.0,
        esc(&c.y_label)
    );
    for (i, s) in c.series.iter().enumerate() {
        let col = COLORS[i % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{col}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &(x, y) in &s.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{col}"><title>{}: x={} y={}</title></circle>"#,
                px(x),
                py(y),
                esc(&s.name),
                trim(x),
                trim(y)
            );
        }
        let ly = y0 + T + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{col}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            L + pw + 12.0,
            L + pw + 32.0,
            L + pw + 38.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
}

/// The charts one above the other, as an SVG document.
pub fn svg(charts: &[Chart]) -> String {
    let h = H * charts.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, c) in charts.iter().enumerate() {
        chart(&mut s, c, i as f64 * H);
    }
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
