//! What a checkpoint location's owner deletes, and when: checkpoints keep-K no longer keeps,
//! what unfinished saves left behind (their files, writers' temporary files, empty step
//! directories), and a failed save's own files. Never a committed checkpoint that is kept, and
//! never anything a save in flight may be writing: only step directories older than the newest
//! committed one, temporary files beside committed ones, and the failed save's own files.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::state::manifest::{step_of, MANIFEST};
use crate::state::Location;
use crate::state_dict::CheckpointError;

/// The committed checkpoints among a location's object names, oldest first: `(step, dir)`.
pub(super) fn committed_dirs(names: &[String]) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = names
        .iter()
        .filter_map(|n| {
            let (dir, file) = n.split_once('/')?;
            (file == MANIFEST).then_some(())?;
            Some((step_of(dir)?, dir.to_string()))
        })
        .collect();
    out.sort();
    out
}

/// The directories (or objects) a location could not delete, each said once: a later tidy
/// tries them again and says nothing more, until one goes.
#[derive(Clone, Debug, Default)]
pub(super) struct Undeletable(Arc<Mutex<BTreeSet<String>>>);

impl Undeletable {
    /// Notes that `name` could not be deleted, and says so the first time.
    fn note(&self, loc: &Location, name: &str, e: &CheckpointError) {
        let mut said = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if said.insert(name.to_string()) {
            tracing::warn!(
                "checkpoints in {}: cannot delete {name} ({e}); it stays, is tried again at each \
                 save, and the others are deleted as they would be",
                loc.describe()
            );
        }
    }

    fn clear(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }
}

/// Deletes, below the newest committed checkpoint: with `keep`, the committed ones older than
/// the newest `keep` (commit point first, so a kill midway leaves an incomplete directory,
/// never a damaged complete one); always, what unfinished saves left (files of step
/// directories without a commit point, writers' temporary files, empty step directories).
/// What cannot be deleted is said once ([`Undeletable`]); the rest is deleted anyway. Only a
/// listing that fails is an error.
pub(super) fn tidy(
    loc: &Location,
    keep: Option<usize>,
    undeletable: &Undeletable,
) -> Result<(), CheckpointError> {
    let names = loc.list()?;
    let done = committed_dirs(&names);
    let Some(&(newest, _)) = done.last() else {
        return Ok(());
    };
    let kept: Vec<&str> = match keep {
        Some(k) => done.iter().rev().take(k).map(|(_, d)| d.as_str()).collect(),
        None => done.iter().map(|(_, d)| d.as_str()).collect(),
    };
    let mut doomed: Vec<&str> = Vec::new();
    for n in &names {
        let Some((dir, _)) = n.split_once('/') else {
            continue;
        };
        if step_of(dir).is_some_and(|s| s < newest)
            && !kept.contains(&dir)
            && !doomed.contains(&dir)
        {
            doomed.push(dir);
        }
    }
    for dir in doomed {
        match delete_dir(loc, dir, &names) {
            Ok(()) => undeletable.clear(dir),
            Err(e) => undeletable.note(loc, dir, &e),
        }
    }
    // temporary files beside committed checkpoints and in older directories, and empty step
    // directories below the newest: no save of this run writes there any more
    for stray in loc.stray()? {
        let dir = stray.split('/').next().unwrap_or_default();
        if step_of(dir).is_some_and(|s| s <= newest) {
            if let Err(e) = loc.remove_stray(&stray) {
                undeletable.note(loc, &stray, &e);
            }
        }
    }
    Ok(())
}

/// Deletes checkpoint directory `dir` (its objects among `names`), commit point first.
fn delete_dir(loc: &Location, dir: &str, names: &[String]) -> Result<(), CheckpointError> {
    let commit_point = format!("{dir}/{MANIFEST}");
    loc.delete(&commit_point, true)?;
    let prefix = format!("{dir}/");
    let mut first_error = None;
    for n in names
        .iter()
        .filter(|n| n.starts_with(&prefix) && **n != commit_point)
    {
        if let Err(e) = loc.delete(n, true) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// After a save of `dir` failed on rank `rank` of `processes`: deletes the files it wrote, so
/// that a save that ran out of room leaves the room it had (the next one can commit). Nothing
/// when `dir` is committed (the failure came after the commit point). The other ranks' files
/// stay for their own ranks, or for the next commit's [`tidy`].
pub(super) fn remove_failed(
    loc: &Location,
    dir: &str,
    rank: usize,
    processes: usize,
) -> Result<(), CheckpointError> {
    let names = loc.list()?;
    if names.iter().any(|n| *n == format!("{dir}/{MANIFEST}")) {
        return Ok(());
    }
    let prefix = format!("{dir}/");
    let mine = |file: &str| {
        processes == 1
            || file.starts_with(&format!("rank-{rank:05}-"))
            || file == format!("rank-{rank:05}.json")
    };
    for n in &names {
        if let Some(file) = n.strip_prefix(&prefix) {
            if mine(file) {
                loc.delete(n, true)?;
            }
        }
    }
    Ok(())
}
