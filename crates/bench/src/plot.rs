//! PNG charts of program runs: memory over time (one line per configuration,
//! as the R paper's Figure 10), and per workload the footprint and runtime
//! of each configuration relative to plain (bars; ksmd's CPU stacked on the
//! runtime bar, as mmapcopy's Figure 2 does). Drawn with plotters' bitmap
//! backend and the font the analyzer loads.

use std::path::Path;

use pagefold_analyze::plot::{load_font, FONT};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const W: u32 = 1100;
const H: u32 = 600;

type Res = Result<(), Box<dyn std::error::Error>>;

/// Colours by configuration, stable across charts.
fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(90, 90, 90),
        RGBColor(40, 110, 200),
        RGBColor(230, 130, 40),
        RGBColor(60, 170, 90),
        RGBColor(200, 60, 60),
        RGBColor(140, 90, 190),
        RGBColor(150, 110, 70),
        RGBColor(220, 100, 170),
    ];
    C[i % C.len()]
}

/// Checks before a long run that a chart can be written to `path`.
pub fn check_target(path: &Path) -> Result<(), String> {
    if path
        .extension()
        .is_none_or(|e| !e.eq_ignore_ascii_case("png"))
    {
        return Err(format!("{}: the plot must be a .png file", path.display()));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(format!("{}: no such directory for the plot", dir.display()));
    }
    load_font()
}

/// Footprint over time, one line per (configuration, (ms, bytes) samples).
pub fn memory_over_time(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(u64, u64)>)],
) -> Result<(), String> {
    load_font()?;
    draw_timeline(path, title, series).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw_timeline(path: &Path, title: &str, series: &[(String, Vec<(u64, u64)>)]) -> Res {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let t_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1000.0;
    let m_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| mib(p.1)))
        .fold(1.0, f64::max)
        * 1.08;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let title: String = title.chars().take(90).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..m_max)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("footprint (MiB)")
        .label_style((FONT, 14))
        .draw()?;
    for (i, (name, samples)) in series.iter().enumerate() {
        let c = color(i);
        let points = samples.iter().map(|&(t, b)| (t as f64 / 1000.0, mib(b)));
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()?;
    root.present()?;
    Ok(())
}

/// One bar group per workload: `values[w][c]` relative to plain (1.0) for
/// configuration `c`, with an optional stacked part (ksmd CPU) on top.
pub struct Bars<'a> {
    pub title: &'a str,
    pub y_desc: &'a str,
    pub workloads: &'a [String],
    pub configs: &'a [String],
    pub values: Vec<Vec<f64>>,
    pub stacked: Vec<Vec<f64>>,
}

pub fn relative_bars(path: &Path, bars: &Bars) -> Result<(), String> {
    load_font()?;
    draw_bars(path, bars).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw_bars(path: &Path, b: &Bars) -> Res {
    let nw = b.workloads.len().max(1);
    let nc = b.configs.len().max(1);
    let top = b
        .values
        .iter()
        .zip(&b.stacked)
        .flat_map(|(v, s)| v.iter().zip(s).map(|(a, c)| a + c))
        .filter(|v| v.is_finite())
        .fold(1.2, f64::max)
        * 1.1;
    // Wide enough that the group labels (about 8 px a character) do not overlap.
    let longest = b
        .workloads
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0) as u32;
    let group_px = 90.max(longest * 8 + 12);
    let root = BitMapBackend::new(path, (W.max(group_px * nw as u32), H)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(b.title, (FONT, 20))
        .margin(15)
        .x_label_area_size(70)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..nw as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(b.y_desc)
        .label_style((FONT, 13))
        .draw()?;
    // Workload names under their groups, placed in pixels: a numeric x axis
    // would label its own round numbers instead.
    for (w, name) in b.workloads.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(w as f64 + 0.5, 0.0));
        let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(name.clone(), (px, py + 8), style))?;
    }
    let width = 0.8 / nc as f64;
    for c in 0..nc {
        let col = color(c);
        let rects = (0..nw).filter_map(|w| {
            let v = *b.values.get(w)?.get(c)?;
            v.is_finite().then(|| {
                let x0 = w as f64 + 0.1 + c as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], col.filled())
            })
        });
        chart
            .draw_series(rects)?
            .label(b.configs[c].clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
        let stacked = (0..nw).filter_map(|w| {
            let v = *b.values.get(w)?.get(c)?;
            let s = *b.stacked.get(w)?.get(c)?;
            (v.is_finite() && s > 0.0).then(|| {
                let x0 = w as f64 + 0.1 + c as f64 * width;
                Rectangle::new(
                    [(x0, v), (x0 + width * 0.9, v + s)],
                    BLACK.mix(0.35).filled(),
                )
            })
        });
        chart.draw_series(stacked)?;
    }
    chart.draw_series(LineSeries::new(
        [(0.0, 1.0), (nw as f64, 1.0)],
        BLACK.stroke_width(1),
    ))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Savings over time as Difference Engine draws them (its Figures 5-7):
/// one line per configuration of (seconds, percent saved), and a dashed
/// vertical line with its name where each phase of the workload began.
pub struct SavingsChart<'a> {
    pub title: &'a str,
    pub series: &'a [(String, Vec<(f64, f64)>)],
    pub phases: &'a [(&'a str, f64)],
}

pub fn savings_over_time(path: &Path, chart: &SavingsChart) -> Result<(), String> {
    load_font()?;
    draw_savings(path, chart).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw_savings(path: &Path, s: &SavingsChart) -> Res {
    let points = || {
        s.series
            .iter()
            .flat_map(|(_, p)| p.iter().copied())
            .filter(|(t, v)| t.is_finite() && v.is_finite())
    };
    let phase_end = s.phases.iter().map(|p| p.1).fold(0.0, f64::max);
    let t_max = points().map(|p| p.0).fold(phase_end, f64::max).max(1.0);
    // Startup samples (both programs nearly empty) can be far below -100%:
    // the axis stops at -50 and lower values are drawn on it.
    let y_min = points().map(|p| p.1).fold(-10.0, f64::min).max(-50.0);
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let title: String = s.title.chars().take(90).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, y_min..105f64)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("savings vs plain (%)")
        .label_style((FONT, 14))
        .draw()?;
    for &(name, at) in s.phases {
        let dashes = (0..40)
            .map(|i| y_min + (105.0 - y_min) * i as f64 / 40.0)
            .collect::<Vec<_>>();
        chart.draw_series(
            dashes
                .chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| PathElement::new(vec![(at, c[0]), (at, c[1])], BLACK.mix(0.4))),
        )?;
        chart.draw_series(std::iter::once(Text::new(
            name.to_string(),
            (at + t_max * 0.005, 101.0),
            (FONT, 13),
        )))?;
    }
    chart.draw_series(LineSeries::new(
        [(0.0, 0.0), (t_max, 0.0)],
        BLACK.stroke_width(1),
    ))?;
    for (i, (name, curve)) in s.series.iter().enumerate() {
        // Colour by position among all configurations (plain is the first and has no curve).
        let c = color(i + 1);
        chart
            .draw_series(LineSeries::new(
                curve.iter().map(|&(t, v)| (t, v.max(y_min))),
                c.stroke_width(2),
            ))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()?;
    root.present()?;
    Ok(())
}
