//! PNG charts of a [`Report`] (`--plot DIR`): savings per technique, the
//! zero-run length distribution, the byte-value histogram, and codec size
//! ratio against time per page. Drawn with plotters' bitmap backend; labels
//! need a TrueType font, which is loaded at run time (no font is bundled):
//! $PAGEFOLD_FONT, else DejaVu Sans or the first .ttf under
//! /usr/share/fonts. Without any font the plots fail with a one-line error.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::{Error, Result};
use crate::Report;

pub const FONT: &str = "sans-serif";
const W: u32 = 1000;
const H: u32 = 600;

fn find_font() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PAGEFOLD_FONT") {
        return Some(PathBuf::from(p));
    }
    for p in [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    ] {
        if Path::new(p).exists() {
            return Some(PathBuf::from(p));
        }
    }
    fn walk(dir: &Path, depth: usize) -> Option<PathBuf> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in &entries {
            if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
                return Some(p.clone());
            }
        }
        if depth > 0 {
            for p in entries.iter().filter(|p| p.is_dir()) {
                if let Some(f) = walk(p, depth - 1) {
                    return Some(f);
                }
            }
        }
        None
    }
    walk(Path::new("/usr/share/fonts"), 3)
}

/// Registers a TrueType font for chart labels once per process (other crates
/// drawing charts use it too); a one-line reason if none is usable.
pub fn load_font() -> std::result::Result<(), String> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let path = find_font().ok_or("no TrueType font found for chart labels (install fonts-dejavu-core or set PAGEFOLD_FONT)")?;
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read font {}: {e}", path.display()))?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            for style in [FontStyle::Normal, FontStyle::Bold] {
                plotters::style::register_font(FONT, style, bytes).map_err(|_| format!("{} is not a usable TrueType font", path.display()))?;
            }
            Ok(())
        })
        .clone()
}

/// Writes every chart the report has data for into `dir` (created if
/// needed); returns the files written.
pub fn plot_all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let err = |detail: String| Error::Plot {
        dir: dir.to_path_buf(),
        detail,
    };
    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    load_font().map_err(err)?;
    let mut files = Vec::new();
    let mut go = |name: &str, f: &dyn Fn(&Path) -> Res| -> Result<()> {
        let path = dir.join(name);
        f(&path).map_err(|e| err(format!("{name}: {e}")))?;
        files.push(path);
        Ok(())
    };
    if !report.savings.is_empty() {
        go("savings.png", &|p| savings(report, p))?;
    }
    if report.characterization.is_some() {
        go("zero_runs.png", &|p| zero_runs(report, p))?;
        go("byte_histogram.png", &|p| byte_histogram(report, p))?;
    }
    if report
        .compression
        .as_ref()
        .is_some_and(|c| c.rows.iter().any(|r| r.ratio.is_finite()))
    {
        go("codecs.png", &|p| codecs(report, p))?;
    }
    Ok(files)
}

type Res = std::result::Result<(), Box<dyn std::error::Error>>;

fn savings(r: &Report, path: &Path) -> Res {
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = r.savings.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Memory saved per technique ({} pages)", r.pages),
            (FONT, 24),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(0f64..100f64, (0..n.saturating_sub(1)).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("saved (%)")
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => r
                .savings
                .get(*i)
                .map(|s| {
                    format!(
                        "{}{}",
                        s.technique,
                        if s.basis == "sampled" { " *" } else { "" }
                    )
                })
                .unwrap_or_default(),
            _ => String::new(),
        })
        .y_labels(n)
        .label_style((FONT, 14))
        .draw()?;
    chart.draw_series(r.savings.iter().enumerate().map(|(i, s)| {
        let color = if s.basis == "sampled" {
            RGBColor(230, 150, 60)
        } else {
            RGBColor(60, 120, 200)
        };
        let v = s.saved_pct.clamp(0.0, 100.0);
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (v, SegmentValue::Exact(i + 1)),
            ],
            color.filled(),
        );
        bar.set_margin(6, 6, 0, 0);
        bar
    }))?;
    chart.draw_series(r.savings.iter().enumerate().map(|(i, s)| {
        Text::new(
            format!("{:.1}%", s.saved_pct),
            (
                s.saved_pct.clamp(0.0, 88.0) + 1.0,
                SegmentValue::CenterOf(i),
            ),
            (FONT, 14),
        )
    }))?;
    root.draw(&Text::new(
        "* sampled",
        (W as i32 - 110, H as i32 - 25),
        (FONT, 13),
    ))?;
    root.present()?;
    Ok(())
}

fn zero_runs(r: &Report, path: &Path) -> Res {
    let c = r.characterization.as_ref().ok_or("no characterisation")?;
    let mut buckets = [0u64; 13];
    for &(len, n) in &c.zero_run_lengths {
        let b = (31 - len.leading_zeros()) as usize;
        buckets[b.min(12)] += n;
    }
    let max = buckets.iter().copied().max().unwrap_or(1).max(1) as f64;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Zero-run length distribution (runs within pages)",
            (FONT, 24),
        )
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (0usize..12).into_segmented(),
            (0.5f64..max * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("run length (bytes)")
        .y_desc("runs")
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .x_labels(13)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(b) if *b == 12 => "4096".into(),
            SegmentValue::CenterOf(b) => format!("{}-{}", 1u32 << b, (1u32 << (b + 1)) - 1),
            _ => String::new(),
        })
        .label_style((FONT, 13))
        .draw()?;
    chart.draw_series(
        buckets
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(b, &n)| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(b), 0.5),
                        (SegmentValue::Exact(b + 1), n as f64),
                    ],
                    RGBColor(60, 120, 200).filled(),
                );
                bar.set_margin(0, 0, 4, 4);
                bar
            }),
    )?;
    root.present()?;
    Ok(())
}

fn byte_histogram(r: &Report, path: &Path) -> Res {
    let c = r.characterization.as_ref().ok_or("no characterisation")?;
    let max = c.byte_histogram.iter().copied().max().unwrap_or(1).max(1) as f64;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Byte values (entropy {:.2} bits/byte, {:.1}% zero)",
                c.entropy_bits_per_byte, c.zero_bytes_pct
            ),
            (FONT, 24),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0u32..256u32, (0.5f64..max * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("byte value")
        .y_desc("bytes")
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .x_labels(17)
        .label_style((FONT, 13))
        .draw()?;
    chart.draw_series(
        c.byte_histogram
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(v, &n)| {
                Rectangle::new(
                    [(v as u32, 0.5), (v as u32 + 1, n as f64)],
                    RGBColor(60, 120, 200).filled(),
                )
            }),
    )?;
    root.present()?;
    Ok(())
}

fn codecs(r: &Report, path: &Path) -> Res {
    let cs = r.compression.as_ref().ok_or("no compression study")?;
    let rows: Vec<_> = cs.rows.iter().filter(|x| x.ratio.is_finite()).collect();
    let t =
        |x: &&crate::study::CodecRow| (x.compress_ns_per_page + x.decompress_ns_per_page).max(1.0);
    let tmin = rows.iter().map(t).fold(f64::INFINITY, f64::min);
    let tmax = rows.iter().map(t).fold(1.0, f64::max);
    let rmax = rows.iter().map(|x| x.ratio).fold(0.0, f64::max).max(0.1) * 1.08;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Codec size ratio vs time per 4 KiB page ({})",
                cs.sample.description
            ),
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((tmin / 1.5..tmax * 1.5).log_scale(), 0f64..rmax)?;
    chart
        .configure_mesh()
        .x_desc("compress + decompress time per page (ns, log)")
        .y_desc("compressed / original")
        .label_style((FONT, 13))
        .draw()?;
    let mut names: Vec<&str> = Vec::new();
    for x in &rows {
        if !names.contains(&x.codec.as_str()) {
            names.push(&x.codec);
        }
    }
    for (i, name) in names.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut pts: Vec<(f64, f64, usize)> = rows
            .iter()
            .filter(|x| x.codec == *name)
            .map(|x| (t(x), x.ratio, x.block))
            .collect();
        pts.sort_by_key(|p| p.2);
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))?
            .label(name.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
        chart.draw_series(
            pts.iter()
                .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
        )?;
        // Mark the 4 KiB point.
        if let Some(p) = pts.first() {
            chart.draw_series(std::iter::once(Text::new(
                format!("{}K", p.2 / 1024),
                (p.0, p.1),
                (FONT, 11),
            )))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
