//! A small RGB raster for the PNG figures (`profile --plot`, `sim --plot`): rectangles, lines,
//! dots and text in the 8×8 bitmap font, encoded with the `png` crate.
//!
//! Hand-written on purpose: plotting crates draw text through the system's fonts
//! (fontconfig/freetype), which a minimal machine or CI image does not have; a built-in
//! bitmap font makes the PNG everywhere.

use flowstack_sim::plot::{Anchor, Pen, Text};
use font8x8::UnicodeFonts;

/// The text's colour.
const INK: (u8, u8, u8) = (0x20, 0x20, 0x20);
/// A glyph's advance in pixels (the 8×8 font's glyphs are at most 7 wide).
const ADVANCE: f64 = 7.0;

/// An RGB raster, white to begin with.
pub struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    /// A white `w` × `h` canvas.
    pub fn new(w: usize, h: usize) -> Self {
        Canvas {
            w,
            h,
            px: vec![0xff; w * h * 3],
        }
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (usize, usize) {
        (self.w, self.h)
    }

    /// The colour at (`x`, `y`), if inside.
    pub fn pixel(&self, x: usize, y: usize) -> Option<(u8, u8, u8)> {
        (x < self.w && y < self.h).then(|| {
            let i = (y * self.w + x) * 3;
            (self.px[i], self.px[i + 1], self.px[i + 2])
        })
    }

    /// A filled rectangle (clipped to the canvas).
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, c: (u8, u8, u8)) {
        let clip = |v: f64, max: usize| (v.round().max(0.0) as usize).min(max);
        let (x0, x1) = (clip(x, self.w), clip(x + w, self.w));
        let (y0, y1) = (clip(y, self.h), clip(y + h, self.h));
        for yy in y0..y1 {
            for xx in x0..x1 {
                let i = (yy * self.w + xx) * 3;
                self.px[i..i + 3].copy_from_slice(&[c.0, c.1, c.2]);
            }
        }
    }

    /// A filled disc of radius `r` about `at`.
    pub fn disc(&mut self, at: (f64, f64), r: f64, c: (u8, u8, u8)) {
        let k = r.ceil() as i64;
        for dy in -k..=k {
            for dx in -k..=k {
                if ((dx * dx + dy * dy) as f64) <= r * r {
                    self.rect(at.0 + dx as f64, at.1 + dy as f64, 1.0, 1.0, c);
                }
            }
        }
    }

    /// A line `width` pixels wide: a square brush stepped along it a pixel at a time.
    pub fn line(&mut self, a: (f64, f64), b: (f64, f64), c: (u8, u8, u8), width: f64) {
        let steps = (b.0 - a.0).abs().max((b.1 - a.1).abs()).ceil().max(1.0) as usize;
        let w = width.max(1.0);
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            let (x, y) = (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
            self.rect(x - w / 2.0, y - w / 2.0, w, w, c);
        }
    }

    /// Text in the 8×8 font (one glyph pixel per pixel, glyphs 7 px apart) starting at `x`,
    /// `baseline` as in SVG; `bold` strikes it twice, a pixel apart.
    pub fn text(&mut self, x: f64, baseline: f64, s: &str, bold: bool) {
        let at = |k: usize, row: usize, col: usize| {
            (
                x + k as f64 * ADVANCE + col as f64,
                baseline - 8.0 + row as f64,
            )
        };
        self.glyphs(s, at, bold);
    }

    /// The same, turned a quarter to the left about (`x`, `baseline`): read bottom to top.
    pub fn text_up(&mut self, x: f64, baseline: f64, s: &str) {
        let at = |k: usize, row: usize, col: usize| {
            (
                x - 8.0 + row as f64,
                baseline - (k as f64 * ADVANCE + col as f64),
            )
        };
        self.glyphs(s, at, false);
    }

    fn glyphs(&mut self, s: &str, at: impl Fn(usize, usize, usize) -> (f64, f64), bold: bool) {
        for (k, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS
                .get(ch)
                .or_else(|| font8x8::LATIN_FONTS.get(ch))
                .unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        let (gx, gy) = at(k, row, col);
                        self.rect(gx, gy, 1.0 + f64::from(u8::from(bold)), 1.0, INK);
                    }
                }
            }
        }
    }

    /// The canvas as a PNG file.
    pub fn png(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, self.w as u32, self.h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(&self.px).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        Ok(out)
    }
}

/// The width `s` takes in the 8×8 font.
fn text_width(s: &str) -> f64 {
    s.chars().count() as f64 * ADVANCE
}

impl Pen for Canvas {
    fn line(&mut self, a: (f64, f64), b: (f64, f64), color: (u8, u8, u8), width: f64) {
        Canvas::line(self, a, b, color, width);
    }
    fn frame(&mut self, x: f64, y: f64, w: f64, h: f64, color: (u8, u8, u8)) {
        let (l, r, t, b) = (x, x + w, y, y + h);
        for (p, q) in [
            ((l, t), (r, t)),
            ((r, t), (r, b)),
            ((r, b), (l, b)),
            ((l, b), (l, t)),
        ] {
            Canvas::line(self, p, q, color, 1.0);
        }
    }
    fn text(&mut self, t: Text<'_>) {
        let shift = match t.anchor {
            Anchor::Start => 0.0,
            Anchor::Middle => text_width(t.s) / 2.0,
            Anchor::End => text_width(t.s),
        };
        let (x, y) = t.at;
        if t.vertical {
            // Turned: "along" runs up from y; centred about y by the same shift.
            self.text_up(x + 4.0, y + shift, t.s);
        } else {
            Canvas::text(self, x - shift, y, t.s, t.bold);
        }
    }
    fn dot(&mut self, at: (f64, f64), r: f64, color: (u8, u8, u8), _label: &str) {
        self.disc(at, r, color);
    }
}
