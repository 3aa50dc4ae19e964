//! What a launcher gives the processes it starts, for tests that start ranks of a run.

use std::net::TcpListener;

/// A loopback port nothing listens on at the moment of asking.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The variables torchrun sets for worker `rank` of `world` on one node, in run `run` (its
/// `--rdzv-id`), first attempt, rendezvous at `127.0.0.1:port`.
pub fn torchrun_vars(rank: usize, world: usize, run: &str, port: u16) -> Vec<(String, String)> {
    let (rank, world) = (rank.to_string(), world.to_string());
    [
        ("RANK", rank.as_str()),
        ("LOCAL_RANK", &rank),
        ("ROLE_RANK", &rank),
        ("WORLD_SIZE", &world),
        ("LOCAL_WORLD_SIZE", &world),
        ("ROLE_WORLD_SIZE", &world),
        ("GROUP_RANK", "0"),
        ("GROUP_WORLD_SIZE", "1"),
        ("ROLE_NAME", "default"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", &port.to_string()),
        ("TORCHELASTIC_RUN_ID", run),
        ("TORCHELASTIC_RESTART_COUNT", "0"),
        ("TORCHELASTIC_MAX_RESTARTS", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
