//! `neuron-pc plot RUN`: the curves of a run's metrics (written here by the library's
//! `monitor::RunLog`, as `train_llama --tensorboard` writes them) drawn to a PNG, read back
//! pixel by pixel; and its bad input, one line each.

use std::path::Path;
use std::process::Command;

use neuron_pc::monitor::RunLog;

fn plot(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .arg("plot")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (width, height, pixels of the loss curve's red, of the throughput curve's green).
fn read_png(path: &Path) -> (u32, u32, usize, usize) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("{other:?}"),
    };
    let pixels = buf[..info.buffer_size()].chunks(px);
    let (mut red, mut green) = (0, 0);
    for p in pixels {
        match (p[0], p[1], p[2]) {
            (255, 0, 0) => red += 1,
            (0, 150, 60) => green += 1,
            _ => {}
        }
    }
    (info.width, info.height, red, green)
}

#[test]
fn a_runs_curves_are_drawn_from_its_metrics() {
    let d = neuron_pc_test_support::paths::fresh_dir("npc-plot", "curves");
    let run = d.join("run");
    let mut log = RunLog::create(&run).unwrap();
    for step in 1..=50u64 {
        let loss = 5.0 / (step as f64).sqrt();
        log.log(
            step,
            &[
                ("train/loss", loss),
                ("perf/tokens_per_s", 1000.0 + step as f64),
            ],
        )
        .unwrap();
    }
    drop(log);
    let (ok, stdout, stderr) = plot(&[run.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("50 steps of loss"), "{stdout}");
    let (w, h, red, green) = read_png(&run.join("curves.png"));
    assert_eq!((w, h), (1200, 450));
    assert!(red > 300 && green > 300, "{red} {green}");
    // no throughput logged: its chart is drawn empty; the loss curve still is
    let only_loss = d.join("only-loss");
    let mut log = RunLog::create(&only_loss).unwrap();
    for step in 1..=50u64 {
        log.log(step, &[("train/loss", 1.0 / step as f64)]).unwrap();
    }
    drop(log);
    let out = d.join("picture.png");
    let (ok, _, stderr) = plot(&[only_loss.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let (_, _, red, green) = read_png(&out);
    assert!(red > 300 && green == 0, "{red} {green}");
    assert!(!only_loss.join("curves.png").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_input_is_one_line_and_writes_nothing() {
    let d = neuron_pc_test_support::paths::fresh_dir("npc-plot", "bad");
    let (ok, _, stderr) = plot(&[d.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("cannot read the run's metrics"), "{stderr}");
    std::fs::write(
        d.join("metrics.jsonl"),
        "{\"step\": 1, \"val/loss\": 2.0}\n",
    )
    .unwrap();
    let (ok, _, stderr) = plot(&[d.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("no train/loss values to plot"), "{stderr}");
    assert!(!d.join("curves.png").exists());
    let _ = std::fs::remove_dir_all(&d);
}
