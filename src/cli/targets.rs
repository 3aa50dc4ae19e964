//! `neuron-pc targets`.

use neuron_pc_compiler::pjrt::{Target, TargetStatus};

#[derive(clap::Args)]
pub struct TargetsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Probes every target; exit status 0 (a missing plugin is information, not a failure).
pub fn run(args: TargetsArgs) -> anyhow::Result<i32> {
    let statuses: Vec<TargetStatus> = Target::ALL.into_iter().map(TargetStatus::probe).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&statuses)?);
        return Ok(0);
    }
    println!(
        "{:<6} {:<7} {:<10} {:<18} LIBRARY",
        "TARGET", "FOUND", "PJRT API", "PLATFORM"
    );
    for s in &statuses {
        let found = match (&s.path, &s.error) {
            (Some(_), None) => "yes",
            (Some(_), Some(_)) => "broken",
            (None, _) => "no",
        };
        let platform = match (&s.platform_name, &s.platform_version) {
            (Some(n), Some(v)) => format!("{n} {v}"),
            _ => "-".to_string(),
        };
        let lib = s
            .path
            .as_ref()
            .map_or_else(|| s.library.clone(), |p| p.display().to_string());
        println!(
            "{:<6} {:<7} {:<10} {:<18} {lib}",
            s.target.name(),
            found,
            s.api_version.as_deref().unwrap_or("-"),
            platform
        );
        if let Some(e) = &s.error {
            println!("       {e}");
        }
    }
    Ok(0)
}
