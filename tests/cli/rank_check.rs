//! The rank-agreement check on a real etcd: processes of a multi-process run (the aot_probe
//! example launched with torchrun's variables) publish each new graph's key and stop with one
//! "diverged" error on every rank when one rank traced another graph, instead of hanging; and
//! the check over several graphs, ranks in threads, through the library.

use crate::etcd_support as etcd_common;
use crate::support as common;

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_common::Etcd;
use neuron_pc::device::rank_check::{GraphNote, RankCheck};
use neuron_pc::store::{RunScope, ScopedStore};

/// Runs `world` probe processes at once as ranks of run `run`; `width(rank)` is each rank's
/// model width (a different one is a rank-dependent shape). Returns each rank's output.
fn launch(etcd: &Etcd, run: &str, world: usize, width: impl Fn(usize) -> usize) -> Vec<Output> {
    let cache = common::tmp(&format!("rank-{run}"));
    let children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(common::probe())
                .args(["--steps", "2", "--variants", "0", "--width"])
                .arg(width(rank).to_string())
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("NEURON_PC_STORE", &etcd.url)
                .env("NEURON_PC_RUN_ID", run)
                .env("NEURON_PC_RANK_CHECK_TIMEOUT", "60")
                .env("NEURON_COMPILE_CACHE_URL", &cache)
                .env_remove("NEURON_CC_FLAGS")
                .env_remove("NEURON_PC_EXTRACT_DIR")
                .env_remove("NEURON_PC_DEVICES")
                .env_remove("TORCHELASTIC_RUN_ID")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(cache);
    outs
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_rank_with_another_shape_stops_every_rank_with_one_diverged_error() {
    let Some(etcd) = Etcd::start("procs") else {
        return;
    };
    for (world, odd) in [(2, 1), (4, 2)] {
        let started = Instant::now();
        let outs = launch(&etcd, &format!("diverge{world}"), world, |r| {
            if r == odd {
                6
            } else {
                8
            }
        });
        let others: Vec<String> = (0..world)
            .filter(|&r| r != odd)
            .map(|r| r.to_string())
            .collect();
        let mut lines = Vec::new();
        for (rank, o) in outs.iter().enumerate() {
            let e = err(o);
            assert_eq!(o.status.code(), Some(1), "rank {rank}/{world}: {e}");
            let line = e
                .lines()
                .find(|l| l.contains("diverged"))
                .unwrap_or_else(|| panic!("rank {rank}/{world}: no diverged error: {e}"));
            for want in [
                "ranks diverged at step 1 (new graph 0)".to_string(),
                format!("rank {odd}'s graph"),
                "in its inputs (input 0".to_string(),
                "f32[6,6] vs f32[8,8]".to_string(),
                format!(
                    "ranks with rank 0's graph: {}; with another: {odd}.",
                    others.join(", ")
                ),
            ] {
                assert!(
                    line.contains(&want),
                    "rank {rank}/{world}: {want:?} in {line}"
                );
            }
            // No step ran: nothing hung waiting in a collective.
            assert!(
                o.stdout.is_empty(),
                "{}",
                String::from_utf8_lossy(&o.stdout)
            );
            lines.push(line.to_string());
        }
        // One error, the same on every rank.
        assert!(lines.iter().all(|l| *l == lines[0]), "{lines:#?}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn agreeing_ranks_pass_the_check_and_run_their_steps_together() {
    let Some(etcd) = Etcd::start("agree") else {
        return;
    };
    let outs = launch(&etcd, "agree", 2, |_| 8);
    let mut losses = Vec::new();
    for (rank, o) in outs.iter().enumerate() {
        let e = err(o);
        assert!(o.status.success(), "rank {rank}: {e}");
        assert!(!e.contains("diverged"), "rank {rank}: {e}");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let steps: Vec<&str> = out.lines().filter(|l| l.starts_with("{\"step\"")).collect();
        assert_eq!(steps.len(), 2, "rank {rank}: {out}");
        losses.push(out);
    }
    // one replica each, their gradients summed between the processes: the same trajectory
    assert_eq!(losses[0], losses[1]);
    // Both published the same key for their first graph.
    let raw = etcd.connect();
    let read = |r: usize| {
        let v = raw
            .try_get(&format!("/neuron-pc/agree/0/graphs/0/rank{r}"))
            .unwrap()
            .unwrap_or_else(|| panic!("rank {r} published nothing"));
        serde_json::from_slice::<GraphNote>(&v).unwrap()
    };
    let (a, b) = (read(0), read(1));
    assert_eq!(a.key.len(), 64);
    assert_eq!(a.key, b.key);
    assert_eq!(a.params, b.params);
}

fn ranks(etcd: &Etcd, run: &str, attempt: u64, world: usize, wait: f64) -> Vec<Arc<RankCheck>> {
    let raw = etcd.connect();
    (0..world)
        .map(|r| {
            let scope = RunScope {
                run_id: run.into(),
                attempt,
            };
            let store = ScopedStore::new(raw.clone(), scope);
            Arc::new(RankCheck::new(
                store,
                r,
                world,
                Duration::from_secs_f64(wait),
            ))
        })
        .collect()
}

fn note(key: &str, batch: usize) -> GraphNote {
    GraphNote {
        key: key.repeat(32),
        step: 0,
        site: "train.rs:40:9".into(),
        params: vec![format!("f32[{batch},16]"), "f32[16,16]".into()],
        names: vec!["".into(), "w".into()],
        ops: vec!["dot".into(), "tanh".into()],
    }
}

/// Every rank in its own thread checks `notes(rank)` in order; each rank's results.
fn run_ranks(
    checks: &[Arc<RankCheck>],
    graphs: usize,
    notes: impl Fn(usize, usize) -> GraphNote + Send + Sync + Clone + 'static,
) -> Vec<Vec<Result<(), String>>> {
    let handles: Vec<_> = checks
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let c = c.clone();
            let notes = notes.clone();
            std::thread::spawn(move || {
                (0..graphs)
                    .map(|g| c.agree(&notes(r, g)).map_err(|e| e.to_string()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_divergence_at_a_later_graph_is_the_same_error_on_every_rank() {
    let Some(etcd) = Etcd::start("later") else {
        return;
    };
    let checks = ranks(&etcd, "later", 0, 4, 30.0);
    // Graphs 0 and 1 agree; at graph 2 rank 3 has a batch of 7 rows.
    let results = run_ranks(&checks, 3, |r, g| {
        let mut n = note(["a", "b", "c"][g], if g == 2 && r == 3 { 7 } else { 8 });
        if g == 2 && r == 3 {
            n.key = "d".repeat(64);
        }
        n.step = g as u64 * 10;
        n
    });
    let want = "ranks diverged at step 20 (new graph 2): rank 3's graph (train.rs:40:9) differs \
                from rank 0's (train.rs:40:9) in its inputs (input 0: f32[7,16] vs f32[8,16]); \
                ranks with rank 0's graph: 0, 1, 2; with another: 3. Every rank must trace the \
                same graphs: look for a branch on the rank or a batch shape that differs";
    for (r, res) in results.iter().enumerate() {
        assert_eq!(res[0], Ok(()), "rank {r}");
        assert_eq!(res[1], Ok(()), "rank {r}");
        assert_eq!(res[2].as_ref().unwrap_err(), want, "rank {r}");
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_after_the_wait_and_a_restart_starts_clean() {
    let Some(etcd) = Etcd::start("missing") else {
        return;
    };
    // Attempt 0: all three ranks publish graph 0.
    let first = ranks(&etcd, "job", 0, 3, 10.0);
    let ok = run_ranks(&first, 1, |_, _| note("a", 8));
    assert!(ok.iter().all(|r| r[0].is_ok()), "{ok:?}");
    // Attempt 1 (a restart): ranks 0 and 1 come back, rank 2 does not. The records attempt 0
    // left must not count.
    let second = ranks(&etcd, "job", 1, 3, 1.0);
    let started = Instant::now();
    let res = run_ranks(&second[..2], 1, |_, _| note("a", 8));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    for (r, res) in res.iter().enumerate() {
        let e = res[0].as_ref().unwrap_err();
        assert!(
            e.starts_with(
                "ranks diverged or stopped: rank(s) 2 did not reach new graph 0 within 1 s; \
                 this rank"
            ) && e.ends_with("ranks 0, 1 did too"),
            "rank {r}: {e}"
        );
    }
}
