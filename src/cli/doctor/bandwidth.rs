//! The bandwidth table of `neuron-pc doctor`: latency and bandwidth of each collective by
//! message size, in the layout and with the conventions of nccl-tests.
//!
//! `size` is the larger buffer of a rank in bytes (all_reduce: its buffer; all_gather: the
//! gathered output, each rank contributing `size / n`; reduce_scatter: the input, each rank
//! keeping `size / n`), `count` its elements. `time` is the median over the timed runs of one
//! `execute_replicated` call (every device, until each has finished). `algbw = size / time`;
//! `busbw` scales it to what each link carries in a ring, comparable across device counts:
//! all_reduce `algbw * 2(n-1)/n`, all_gather and reduce_scatter `algbw * (n-1)/n`. `#wrong`
//! counts the elements of the last run that differ from the exact result.

use std::time::{Duration, Instant};

use anyhow::Context;
use neuron_pc_compiler::pjrt::{Buffer, Device};
use neuron_pc_compiler::{DType, HostTensor};
use serde_json::json;

use super::devices::{compile, Collective, Setup};
use super::{say, Check, DoctorArgs, Status};

/// One row of the table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub collective: &'static str,
    /// Bytes of the larger buffer of a rank (see the module docs).
    pub size_bytes: u64,
    /// Elements of that buffer.
    pub count: u64,
    pub dtype: &'static str,
    /// Median time of one run over every device, microseconds.
    pub time_us: f64,
    /// `size / time`, GB/s (10^9 bytes).
    pub algbw_gbps: f64,
    /// `algbw` times the collective's bus factor, GB/s.
    pub busbw_gbps: f64,
    /// Elements of the last run that differ from the exact result, over every device.
    pub wrong: u64,
}

/// The bus bandwidth factor of nccl-tests for `c` over `n` ranks.
pub fn bus_factor(c: Collective, n: usize) -> f64 {
    let n = n as f64;
    match c {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter => (n - 1.0) / n,
    }
}

/// Element counts of the table: `min_bytes`, then each `factor` times the one before up to
/// `max_bytes`, as whole f32 elements divisible by `n` (a rank's share must be whole), without
/// repeats and without empty sizes.
pub fn counts(min_bytes: u64, max_bytes: u64, factor: u64, n: u64) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    let mut size = min_bytes;
    while size <= max_bytes {
        let count = size / 4 / n * n;
        if count > 0 && out.last() != Some(&count) {
            out.push(count);
        }
        match size.checked_mul(factor) {
            Some(next) => size = next,
            None => break,
        }
    }
    out
}

/// The inputs and outputs repeat every 8 elements: rank `r` holds `(i + r) % 8` at index `i`
/// (small integers, so every sum is exact). Building and comparing them is then copying and
/// comparing bytes, quick for a 16 MiB message even in a debug build.
const PERIOD: usize = 8;

/// The input pattern: `INPUT[k] = k`, read from position `r` on rank `r`.
const INPUT: [f32; PERIOD] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];

/// `len` f32 values (little-endian bytes) whose element `j` is `pattern[(start + j) % 8]`.
fn periodic(pattern: &[f32; PERIOD], start: u64, len: u64) -> anyhow::Result<Vec<u8>> {
    let total = len as usize * 4;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(total.max(PERIOD * 4))
        .with_context(|| format!("allocating {total} bytes on the host"))?;
    bytes.extend(
        (0..PERIOD as u64)
            .flat_map(|j| pattern[((start + j) % PERIOD as u64) as usize].to_le_bytes()),
    );
    // Doubling keeps the length a whole number of periods until the last, partial copy.
    while bytes.len() < total {
        let take = bytes.len().min(total - bytes.len());
        bytes.extend_from_within(..take);
    }
    bytes.truncate(total);
    Ok(bytes)
}

/// `sums[k]`: the sum over `n` ranks of the inputs at an index `i` with `i % 8 == k`.
fn sums(n: u64) -> [f32; PERIOD] {
    let mut sums = [0.0f32; PERIOD];
    for (k, s) in sums.iter_mut().enumerate() {
        *s = (0..n).map(|r| INPUT[(k + r as usize) % PERIOD]).sum();
    }
    sums
}

/// Rank `r`'s input for `c` over `count` elements and `n` ranks, as bytes.
fn input_bytes(c: Collective, count: u64, n: u64, r: u64) -> anyhow::Result<Vec<u8>> {
    let len = match c {
        Collective::AllGather => count / n,
        Collective::AllReduce | Collective::ReduceScatter => count,
    };
    periodic(&INPUT, r, len)
}

/// Rank `q`'s exact output for `c`, as bytes.
fn expected_bytes(c: Collective, count: u64, n: u64, q: u64) -> anyhow::Result<Vec<u8>> {
    let share = count / n;
    match c {
        Collective::AllReduce => periodic(&sums(n), 0, count),
        Collective::ReduceScatter => periodic(&sums(n), q * share, share),
        Collective::AllGather => {
            let mut out = Vec::new();
            out.try_reserve_exact(count as usize * 4)
                .with_context(|| format!("allocating {} bytes on the host", count * 4))?;
            for r in 0..n {
                out.extend_from_slice(&periodic(&INPUT, r, share)?);
            }
            Ok(out)
        }
    }
}

/// The bandwidth check and the table's rows; with `print`, the table goes to stdout as it is
/// measured.
pub fn sweep(s: &Setup, args: &DoctorArgs, print: bool) -> (Check, Vec<Row>) {
    let n = s.devices.len();
    if args.skip_bandwidth {
        return (
            Check::new("bandwidth", Status::Skip, "--skip-bandwidth"),
            Vec::new(),
        );
    }
    if n == 1 {
        return (
            Check::new(
                "bandwidth",
                Status::Skip,
                "one device: collectives are trivial, there is no link to measure",
            ),
            Vec::new(),
        );
    }
    let counts = counts(
        args.min_bytes,
        args.max_bytes,
        u64::from(args.factor),
        n as u64,
    );
    if counts.is_empty() {
        let detail = format!(
            "no message size from --min-bytes to --max-bytes holds one f32 per device ({n} \
             devices)"
        );
        return (Check::fail("bandwidth", detail), Vec::new());
    }
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    if print {
        say(&table_header(n, args.iters, args.warmup));
    }
    for c in Collective::ALL {
        for &count in &counts {
            match measure(s, c, count, args.warmup, args.iters) {
                Ok(row) => {
                    if print {
                        say(&table_row(&row));
                    }
                    if row.wrong > 0 {
                        problems.push(format!(
                            "{} at {} B: {} elements wrong",
                            c.name(),
                            row.size_bytes,
                            row.wrong
                        ));
                    }
                    rows.push(row);
                }
                Err(e) => {
                    // Larger sizes of this collective would fail the same way.
                    problems.push(format!("{} at {} B: {e:#}", c.name(), count * 4));
                    break;
                }
            }
        }
    }
    let data = json!({
        "devices": n,
        "iters": args.iters,
        "warmup": args.warmup,
        "sizes": counts.len(),
    });
    if !problems.is_empty() {
        return (
            Check::fail("bandwidth", problems.join("; ")).with_data(data),
            rows,
        );
    }
    let largest: Vec<String> = Collective::ALL
        .iter()
        .filter_map(|c| rows.iter().rev().find(|r| r.collective == c.name()))
        .map(|r| format!("{} {:.2}", r.collective, r.busbw_gbps))
        .collect();
    let detail = format!(
        "{} collectives x {} sizes ({}..{}) over {n} devices, median of {} runs; busbw GB/s at \
         the largest size: {}",
        Collective::ALL.len(),
        counts.len(),
        human_bytes(counts[0] * 4),
        human_bytes(counts[counts.len() - 1] * 4),
        args.iters,
        largest.join(", ")
    );
    (Check::ok("bandwidth", detail).with_data(data), rows)
}

/// Compiles `c` for `count` elements, runs it `warmup` times untimed and `iters` times timed,
/// and checks the last run's outputs.
fn measure(s: &Setup, c: Collective, count: u64, warmup: u32, iters: u32) -> anyhow::Result<Row> {
    let n = s.devices.len() as u64;
    let share = count / n;
    let in_count = match c {
        Collective::AllGather => share,
        Collective::AllReduce | Collective::ReduceScatter => count,
    };
    let g = c.graph(n as usize, &[in_count as usize])?;
    let exe = compile(s, &g)?;
    // One rank's input at a time on the host: the peak is one message, not one per device.
    let mut buffers: Vec<Buffer> = Vec::with_capacity(s.devices.len());
    for (r, &d) in s.devices.iter().enumerate() {
        let bytes = input_bytes(c, count, n, r as u64)?;
        let host = HostTensor::from_bytes(DType::F32, &[in_count as usize], bytes)?;
        let buffer = s
            .client
            .buffer_from_host(&host, Device(d))
            .with_context(|| format!("copying {} bytes to device {d}", in_count * 4))?;
        buffers.push(buffer);
    }
    let args: Vec<Vec<&Buffer>> = buffers.iter().map(|b| vec![b]).collect();
    for _ in 0..warmup {
        exe.execute_replicated(&args).context("running")?;
    }
    let mut times = Vec::with_capacity(iters as usize);
    let mut last = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        let out = exe.execute_replicated(&args).context("running")?;
        times.push(t.elapsed());
        last = out;
    }
    let wrong = count_wrong(c, &last, count)?;
    let time = median(&mut times);
    let seconds = time.as_secs_f64().max(1e-9);
    let size_bytes = count * 4;
    let algbw = size_bytes as f64 / seconds / 1e9;
    Ok(Row {
        collective: c.name(),
        size_bytes,
        count,
        dtype: "float",
        time_us: seconds * 1e6,
        algbw_gbps: algbw,
        busbw_gbps: algbw * bus_factor(c, n as usize),
        wrong,
    })
}

/// Elements of the outputs (rank `q`'s at position `q`) that differ from the exact result.
fn count_wrong(c: Collective, outputs: &[Vec<Buffer>], count: u64) -> anyhow::Result<u64> {
    let n = outputs.len() as u64;
    let mut wrong = 0;
    for (q, out) in outputs.iter().enumerate() {
        let Some(b) = out.first() else {
            anyhow::bail!("replica {q} returned no output")
        };
        let host = b.to_host()?;
        let want = expected_bytes(c, count, n, q as u64)?;
        if host.dtype() != DType::F32 || host.bytes().len() != want.len() {
            anyhow::bail!(
                "replica {q} returned {}{:?}, not f32[{}]",
                host.dtype(),
                host.dims(),
                want.len() / 4
            );
        }
        if host.bytes() != want.as_slice() {
            wrong += host
                .bytes()
                .chunks_exact(4)
                .zip(want.chunks_exact(4))
                .filter(|(g, w)| g != w)
                .count() as u64;
        }
    }
    Ok(wrong)
}

/// The median (the mean of the middle two for an even number).
fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    match times.len() {
        0 => Duration::ZERO,
        len if len % 2 == 1 => times[len / 2],
        len => (times[len / 2 - 1] + times[len / 2]) / 2,
    }
}

/// `1 KiB`, `16 MiB`, `1.5 GiB`, or bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The table's header in nccl-tests' layout (`#` lines).
pub fn table_header(devices: usize, iters: u32, warmup: u32) -> String {
    format!(
        "# {devices} devices, median of {iters} timed runs after {warmup} untimed; size: the \
         larger buffer of a rank\n# busbw = algbw * 2(n-1)/n (all_reduce), algbw * (n-1)/n \
         (all_gather, reduce_scatter)\n#{:>15}  {:>10}  {:>10}  {:>5}  {:>10}  {:>12}  {:>12}  \
         {:>6}",
        "collective",
        "size (B)",
        "count",
        "type",
        "time (us)",
        "algbw (GB/s)",
        "busbw (GB/s)",
        "#wrong"
    )
}

/// One row of the table as text, under [`table_header`].
pub fn table_row(r: &Row) -> String {
    format!(
        " {:>15}  {:>10}  {:>10}  {:>5}  {:>10.2}  {:>12.3}  {:>12.3}  {:>6}",
        r.collective,
        r.size_bytes,
        r.count,
        r.dtype,
        r.time_us,
        r.algbw_gbps,
        r.busbw_gbps,
        r.wrong
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Collective::ReduceScatter, 8), 0.875);
        assert_eq!(bus_factor(Collective::AllReduce, 1), 0.0);
    }

    #[test]
    fn counts_are_whole_shares_without_repeats() {
        assert_eq!(counts(1024, 16384, 4, 4), [256, 1024, 4096]);
        // 1 KiB over 3 ranks: 256 elements round down to 255.
        assert_eq!(counts(1024, 4096, 2, 3), [255, 510, 1023]);
        // Sizes too small for one element per rank are left out.
        assert_eq!(counts(4, 64, 2, 8), [8, 16]);
        assert!(counts(4, 8, 2, 64).is_empty());
        assert_eq!(counts(8 << 30, 8 << 30, 1024, 2), [2 << 30]);
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn inputs_and_expected_outputs_follow_the_definitions() {
        // Two ranks, four elements: rank r holds (i + r) % 8.
        assert_eq!(
            floats(&input_bytes(Collective::AllReduce, 4, 2, 1).unwrap()),
            [1.0, 2.0, 3.0, 4.0]
        );
        let out = |c, q| floats(&expected_bytes(c, 4, 2, q).unwrap());
        assert_eq!(out(Collective::AllReduce, 0), [1.0, 3.0, 5.0, 7.0]);
        // Gathered: rank 0's two elements [0, 1], then rank 1's [1, 2].
        assert_eq!(out(Collective::AllGather, 1), [0.0, 1.0, 1.0, 2.0]);
        // Rank 1 keeps elements 2 and 3 of the sum.
        assert_eq!(out(Collective::ReduceScatter, 1), [5.0, 7.0]);
        // Against the definitions, with lengths that are not whole periods (and one over the
        // doubling's steps).
        let input = |i: u64, r: u64| ((i + r) % 8) as f32;
        for (count, n) in [(60, 5), (3 * 1031, 3)] {
            let share = count / n;
            for c in Collective::ALL {
                for q in 0..n {
                    let mine: Vec<f32> = match c {
                        Collective::AllGather => (0..share).map(|i| input(i, q)).collect(),
                        _ => (0..count).map(|i| input(i, q)).collect(),
                    };
                    assert_eq!(floats(&input_bytes(c, count, n, q).unwrap()), mine);
                    let want: Vec<f32> = match c {
                        Collective::AllReduce => (0..count)
                            .map(|i| (0..n).map(|r| input(i, r)).sum())
                            .collect(),
                        Collective::AllGather => {
                            (0..count).map(|i| input(i % share, i / share)).collect()
                        }
                        Collective::ReduceScatter => (0..share)
                            .map(|i| (0..n).map(|r| input(q * share + i, r)).sum())
                            .collect(),
                    };
                    let got = floats(&expected_bytes(c, count, n, q).unwrap());
                    assert_eq!(got, want, "{c:?} rank {q} of {n}, {count} elements");
                }
            }
        }
    }

    #[test]
    fn medians_and_sizes() {
        let ms = Duration::from_millis;
        assert_eq!(median(&mut [ms(5), ms(1), ms(3)]), ms(3));
        assert_eq!(
            median(&mut [ms(4), ms(1), ms(2), ms(3)]),
            Duration::from_micros(2500)
        );
        assert_eq!(human_bytes(1024), "1 KiB");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        assert_eq!(human_bytes(1020), "1020 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
