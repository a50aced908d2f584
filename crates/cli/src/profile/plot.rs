//! `--plot`: one stacked bar per path and size, a segment per layer, as SVG or PNG.
//!
//! Both formats draw the same [`Chart`]: the SVG as vector shapes with hover titles, the
//! PNG in the CLI's raster ([`crate::raster`]: rectangles and an 8×8 bitmap font, encoded
//! with the `png` crate). The chart reads only the report schema ([`SizeReport`]), so it
//! could draw a JSON file as well.

use crate::raster::Canvas;
use flowstack_prof::report::{layer_name, PathReport, SizeReport};
use std::fmt::Write as _;
use std::path::Path;

/// Output format.
#[derive(Clone, Copy, Debug)]
pub enum Format {
    Svg,
    Png,
}

/// The legend's `i`-th colour: hues a golden angle apart, so neighbours differ and no two
/// of a few dozen look alike.
fn color(i: usize) -> (u8, u8, u8) {
    let h = (i as f64 * 137.508) % 360.0;
    let (s, l) = if i.is_multiple_of(2) {
        (0.55, 0.55)
    } else {
        (0.45, 0.40)
    };
    let c = (1.0 - (2.0 * l - 1.0_f64).abs()) * s;
    let x = c * (1.0 - ((h / 60.0) % 2.0 - 1.0).abs());
    let m = l - c / 2.0;
    let (r, g, b) = match (h / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let q = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    (q(r), q(g), q(b))
}

const TITLE: &str = "flowstack per-layer cost of one segment (ns, probe overhead subtracted)";
const BAR_H: f64 = 22.0;
const GAP: f64 = 10.0;
const LEFT: f64 = 190.0;
const WIDTH: f64 = 640.0;
const LEGEND_ROW: f64 = 16.0;

/// A bar: its label, its segments (legend index, ns), its total.
struct Bar {
    label: String,
    segments: Vec<(usize, f64)>,
    total_ns: f64,
}

/// What is drawn, independent of the format.
struct Chart {
    bars: Vec<Bar>,
    legend: Vec<String>,
    max_ns: f64,
}

impl Chart {
    fn new(results: &[SizeReport]) -> Self {
        let mut legend: Vec<String> = vec![];
        let mut bars = vec![];
        for r in results {
            for (label, p) in [
                (format!("send+ACK {} B", r.size), &r.paths.send),
                (format!("receive {} B", r.size), &r.paths.receive),
            ] {
                bars.push(Bar {
                    label,
                    segments: segments(p, &mut legend),
                    total_ns: p.total.ns,
                });
            }
        }
        let max_ns = bars.iter().map(|b| b.total_ns).fold(1.0, f64::max);
        Chart {
            bars,
            legend,
            max_ns,
        }
    }

    fn height(&self) -> f64 {
        40.0 + self.bars.len() as f64 * (BAR_H + GAP) + 30.0 + LEGEND_ROW * self.legend.len() as f64
    }

    fn width(&self) -> f64 {
        LEFT + WIDTH + 80.0
    }

    fn bar_y(&self, i: usize) -> f64 {
        40.0 + i as f64 * (BAR_H + GAP)
    }

    fn legend_y(&self, i: usize) -> f64 {
        40.0 + self.bars.len() as f64 * (BAR_H + GAP) + 20.0 + i as f64 * LEGEND_ROW
    }

    /// Each bar's segments as (legend index, x, width) in chart coordinates.
    fn layout(&self, bar: &Bar) -> Vec<(usize, f64, f64)> {
        let mut x = LEFT;
        bar.segments
            .iter()
            .map(|&(n, ns)| {
                let w = ns.max(0.0) / self.max_ns * WIDTH;
                let r = (n, x, w);
                x += w;
                r
            })
            .collect()
    }
}

fn segments(p: &PathReport, legend: &mut Vec<String>) -> Vec<(usize, f64)> {
    p.layers
        .iter()
        .map(|l| {
            let name = format!("{}: {}", l.phase.name(), layer_name(l.phase, l.layer));
            let i = legend.iter().position(|m| *m == name).unwrap_or_else(|| {
                legend.push(name);
                legend.len() - 1
            });
            (i, l.ns)
        })
        .collect()
}

fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

fn to_svg(c: &Chart) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\">{TITLE}</text>\n",
        c.width(),
        c.height()
    );
    for (i, bar) in c.bars.iter().enumerate() {
        let y = c.bar_y(i);
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\">{}</text>", y + 15.0, bar.label);
        let mut end = LEFT;
        for ((n, x, w), &(_, ns)) in c.layout(bar).into_iter().zip(&bar.segments) {
            let _ = writeln!(
                s,
                "<rect x=\"{x:.1}\" y=\"{y}\" width=\"{w:.1}\" height=\"{BAR_H}\" fill=\"{}\"><title>{}: {ns:.1} ns</title></rect>",
                hex(color(n)),
                c.legend[n]
            );
            end = x + w;
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\">{:.0} ns</text>",
            end + 4.0,
            y + 15.0,
            bar.total_ns
        );
    }
    for (i, name) in c.legend.iter().enumerate() {
        let y = c.legend_y(i);
        let _ = writeln!(
            s,
            "<rect x=\"10\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"28\" y=\"{}\">{name}</text>",
            hex(color(i)),
            y + 11.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn to_png(c: &Chart) -> Result<Vec<u8>, String> {
    let mut cv = Canvas::new(c.width().ceil() as usize, c.height().ceil() as usize);
    cv.text(10.0, 20.0, TITLE, false);
    for (i, bar) in c.bars.iter().enumerate() {
        let y = c.bar_y(i);
        cv.text(10.0, y + 15.0, &bar.label, false);
        let mut end = LEFT;
        for (n, x, w) in c.layout(bar) {
            cv.rect(x, y, w, BAR_H, color(n));
            end = x + w;
        }
        cv.text(
            end + 4.0,
            y + 15.0,
            &format!("{:.0} ns", bar.total_ns),
            false,
        );
    }
    for (i, name) in c.legend.iter().enumerate() {
        let y = c.legend_y(i);
        cv.rect(10.0, y, 12.0, 12.0, color(i));
        cv.text(28.0, y + 11.0, name, false);
    }
    cv.png()
}

/// Draws the results into `path`.
pub fn write(path: &Path, f: Format, results: &[SizeReport]) -> Result<(), String> {
    let chart = Chart::new(results);
    let bytes = match f {
        Format::Svg => to_svg(&chart).into_bytes(),
        Format::Png => to_png(&chart)?,
    };
    std::fs::write(path, bytes).map_err(|e| e.to_string())
}
