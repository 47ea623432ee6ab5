//! SVG plots with plotters: CDFs (one step line per series) and metric-vs-x line charts.

use anyhow::{Result, anyhow, bail};
use plotters::prelude::*;
use std::path::Path;

/// Samples of one CDF line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Samples (any order).
    pub values: Vec<f64>,
}

/// Points of one line of an xy chart.
#[derive(Clone, Debug, PartialEq)]
pub struct XySeries {
    /// Legend text.
    pub name: String,
    /// (x, y) points, drawn in this order.
    pub points: Vec<(f64, f64)>,
}

/// Titles and size of a plot.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotOpts {
    /// Caption.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic x axis (non-positive values are left out).
    pub log_x: bool,
    /// Y axis from 0 (xy plots; CDFs always span 0..1).
    pub y_from_zero: bool,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

impl PlotOpts {
    /// 800x500, linear axes, y from zero.
    pub fn new(title: &str, x_label: &str, y_label: &str) -> PlotOpts {
        PlotOpts {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            y_from_zero: true,
            width: 800,
            height: 500,
        }
    }
    /// Sets `log_x`.
    pub fn log_x(mut self, on: bool) -> Self {
        self.log_x = on;
        self
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// The step points of an empirical CDF of `values` (sorted; at most ~4000 points: evenly
/// spaced ranks plus every point of the top 1%, so tails stay exact).
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let tail = (n / 100).min(2000);
    let step = (n / 2000).max(1);
    let mut pts = Vec::new();
    let mut prev_y = 0.0;
    for (i, &x) in v.iter().enumerate() {
        let y = (i + 1) as f64 / n as f64;
        if i % step == 0 || i + tail >= n || i + 1 == n {
            pts.push((x, prev_y));
            pts.push((x, y));
            prev_y = y;
        }
    }
    pts
}

fn check_svg(path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(()),
        _ => bail!(
            "{}: only .svg output is supported (SVG needs no fonts)",
            path.display()
        ),
    }
}

fn bounds(lines: &[(String, Vec<(f64, f64)>)], log_x: bool) -> (f64, f64, f64, f64) {
    let pts = lines
        .iter()
        .flat_map(|l| l.1.iter())
        .filter(|p| p.0.is_finite() && p.1.is_finite() && (!log_x || p.0 > 0.0));
    let (mut x0, mut x1, mut y0, mut y1) =
        (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (if log_x { 1.0 } else { 0.0 }, 1.0, 0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = if log_x { x0 * 10.0 } else { x0 + 1.0 };
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    (x0, x1, y0, y1)
}

macro_rules! draw_chart {
    ($path:expr, $opts:expr, $xr:expr, $yr:expr, $lines:expr, $markers:expr, $legend:expr) => {{
        let root = SVGBackend::new($path, ($opts.width, $opts.height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&$opts.title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d($xr, $yr)
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc($opts.x_label.as_str())
            .y_desc($opts.y_label.as_str())
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, (name, pts)) in $lines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = pts
                .iter()
                .copied()
                .filter(|p| !$opts.log_x || p.0 > 0.0)
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            if $markers {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| anyhow!("{e}"))?;
            }
        }
        if $lines.len() > 0 {
            chart
                .configure_series_labels()
                .position($legend)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
        }
        root.present().map_err(|e| anyhow!("{e}"))?;
    }};
}

/// Writes an SVG with the empirical CDF of each series.
pub fn cdf_plot(path: &Path, opts: &PlotOpts, series: &[Series]) -> Result<()> {
    check_svg(path)?;
    let lines: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| (s.name.clone(), cdf_points(&s.values)))
        .collect();
    let (x0, x1, _, _) = bounds(&lines, opts.log_x);
    if opts.log_x {
        draw_chart!(
            path,
            opts,
            (x0..x1).log_scale(),
            0f64..1.0f64,
            lines,
            false,
            SeriesLabelPosition::LowerRight
        );
    } else {
        draw_chart!(
            path,
            opts,
            x0..x1,
            0f64..1.0f64,
            lines,
            false,
            SeriesLabelPosition::LowerRight
        );
    }
    Ok(())
}

/// Writes an SVG with one line (with point markers) per series.
pub fn xy_plot(path: &Path, opts: &PlotOpts, series: &[XySeries]) -> Result<()> {
    check_svg(path)?;
    let lines: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| (s.name.clone(), s.points.clone()))
        .collect();
    let (x0, x1, y0, y1) = bounds(&lines, opts.log_x);
    let y0 = if opts.y_from_zero { y0.min(0.0) } else { y0 };
    let pad = (y1 - y0) * 0.05;
    let yr = y0..(y1 + pad);
    if opts.log_x {
        draw_chart!(
            path,
            opts,
            (x0..x1).log_scale(),
            yr,
            lines,
            true,
            SeriesLabelPosition::UpperRight
        );
    } else {
        let xpad = (x1 - x0) * 0.03;
        draw_chart!(
            path,
            opts,
            (x0 - xpad)..(x1 + xpad),
            yr,
            lines,
            true,
            SeriesLabelPosition::UpperRight
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_steps() {
        let p = cdf_points(&[3.0, 1.0, 2.0]);
        assert_eq!(
            p,
            vec![
                (1.0, 0.0),
                (1.0, 1.0 / 3.0),
                (2.0, 1.0 / 3.0),
                (2.0, 2.0 / 3.0),
                (3.0, 2.0 / 3.0),
                (3.0, 1.0)
            ]
        );
        let big: Vec<f64> = (0..100_000).map(|x| x as f64).collect();
        let p = cdf_points(&big);
        assert!(p.len() < 10_000);
        assert_eq!(p.last().copied(), Some((99_999.0, 1.0)));
    }
}
