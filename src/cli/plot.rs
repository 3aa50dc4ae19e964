//! `neuron-pc plot RUN`: a run's loss and throughput curves, drawn to a PNG from the
//! `metrics.jsonl` that `monitor::RunLog` (`train_llama --tensorboard DIR`) writes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;

/// `neuron-pc plot` options.
#[derive(clap::Args)]
pub struct PlotArgs {
    /// The run's metrics directory (`--tensorboard DIR`), or its `metrics.jsonl`.
    run: PathBuf,
    /// The PNG to write (default: `curves.png` in the run's directory).
    #[arg(short, long)]
    out: Option<PathBuf>,
}

/// TrueType fonts looked for, in order (Debian's `fonts-dejavu-core`, then others').
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// One curve: `(step, value)` points.
type Points = Vec<(f64, f64)>;

/// The points of `tag` in the logged steps `lines`, in order.
fn series(lines: &[serde_json::Value], tag: &str) -> Points {
    lines
        .iter()
        .filter_map(|v| Some((v["step"].as_f64()?, v[tag].as_f64()?)))
        .filter(|(_, y)| y.is_finite())
        .collect()
}

pub fn run(args: PlotArgs) -> anyhow::Result<i32> {
    let file = if args.run.is_dir() {
        // `monitor::JSONL` (the `monitor` feature is not the command line's)
        args.run.join("metrics.jsonl")
    } else {
        args.run.clone()
    };
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "{}: cannot read the run's metrics (a --tensorboard directory holds metrics.jsonl)",
            file.display()
        )
    })?;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let (loss, val, tps) = (
        series(&lines, "train/loss"),
        series(&lines, "val/loss"),
        series(&lines, "perf/tokens_per_s"),
    );
    if loss.is_empty() {
        bail!("{}: no train/loss values to plot", file.display());
    }
    let font = FONTS
        .iter()
        .find_map(|f| std::fs::read(f).ok())
        .with_context(|| {
            format!(
                "no TrueType font found to draw the labels with (looked for {}): install \
                 fonts-dejavu-core",
                FONTS.join(", ")
            )
        })?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into()))
        .map_err(|_| anyhow::anyhow!("the font found cannot be read"))?;
    let out = args.out.unwrap_or_else(|| {
        file.parent()
            .unwrap_or_else(|| Path::new("."))
            .join("curves.png")
    });
    // drawn beside, then renamed over: a failed draw leaves no half a picture
    let tmp = out.with_extension(format!("tmp.{}.png", std::process::id()));
    let title = file
        .parent()
        .and_then(|p| p.file_name())
        .map_or_else(|| "run".to_string(), |n| n.to_string_lossy().into_owned());
    let drawn = draw(&tmp, &title, &loss, &val, &tps);
    if let Err(e) = drawn {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("drawing {}", out.display())));
    }
    std::fs::rename(&tmp, &out).with_context(|| format!("writing {}", out.display()))?;
    println!(
        "wrote {} ({} steps of loss, {} of validation, {} of throughput)",
        out.display(),
        loss.len(),
        val.len(),
        tps.len()
    );
    Ok(0)
}

fn draw(path: &Path, title: &str, loss: &Points, val: &Points, tps: &Points) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (1200, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(600);
    let losses = [("train", loss, RED), ("validation", val, BLUE)];
    chart(&left, &format!("{title}: loss"), &losses)?;
    chart(
        &right,
        &format!("{title}: tokens/s"),
        &[("train", tps, RGBColor(0, 150, 60))],
    )?;
    root.present().map_err(plot_error)
}

fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// One chart of `curves` (name, points, colour) over the steps.
fn chart(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    curves: &[(&str, &Points, RGBColor)],
) -> anyhow::Result<()> {
    let all = || curves.iter().flat_map(|c| c.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all() {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        // nothing logged (no throughput yet): an empty chart
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    let mut c = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1.max(x0 + 1.0), (y0 - pad)..(y1 + pad))
        .map_err(plot_error)?;
    c.configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if y1 >= 100.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.2}")
            }
        })
        .draw()
        .map_err(plot_error)?;
    for (name, points, color) in curves.iter().filter(|c| !c.1.is_empty()) {
        let color = *color;
        c.draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(plot_error)?
        .label(*name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}
