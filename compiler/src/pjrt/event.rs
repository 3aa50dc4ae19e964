//! Completion events: what an asynchronous execution hands back instead of blocking. An
//! [`Event`] can be waited on, polled, or given a callback that runs when it completes (on a
//! plugin thread), which is how execution time is measured from launch to completion.

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

use super::client::Client;
use super::sys::{self, Args};
use crate::error::Result;

/// A PJRT event: becomes ready once, with success or the error of the work it stands for.
pub struct Event {
    client: Client,
    raw: *mut sys::PJRT_Event,
}

// SAFETY: PJRT events are thread-safe futures by the C API's contract (await, poll and
// callbacks may come from any thread); the pointer is owned by this value alone.
unsafe impl Send for Event {}
// SAFETY: as above; every method takes `&self` and makes one thread-safe call.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").finish_non_exhaustive()
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Event_Destroy_Args {
            event: self.raw,
            ..Args::new()
        };
        if let Err(e) = pjrt_call!(self.client.plugin_ref(), PJRT_Event_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT event failed: {e}");
        }
    }
}

/// What a completion callback carries through the plugin: the client (to read the error) and
/// the closure.
struct Pending {
    client: Client,
    callback: Box<dyn FnOnce(Result<()>) + Send>,
}

extern "C" fn on_ready_trampoline(error: *mut sys::PJRT_Error, user_arg: *mut c_void) {
    // SAFETY: `user_arg` is the `Box<Pending>` leaked by `Event::on_ready`; the plugin calls
    // this exactly once per registration, so the box is reclaimed exactly once.
    let pending = unsafe { Box::from_raw(user_arg.cast::<Pending>()) };
    let status = pending
        .client
        .plugin_ref()
        .check("PJRT_Event_OnReady", error);
    // A panic must not unwind into the plugin's C++ frames.
    let run = AssertUnwindSafe(move || (pending.callback)(status));
    if std::panic::catch_unwind(run).is_err() {
        tracing::error!("a completion callback panicked");
    }
}

impl Event {
    /// Takes ownership of `raw` (none for a null pointer: the work was already complete).
    pub(crate) fn adopt(client: &Client, raw: *mut sys::PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then(|| Event {
            client: client.clone(),
            raw,
        })
    }

    /// Blocks until the event is ready; the error of the work it stands for, if it failed.
    pub fn wait(&self) -> Result<()> {
        let mut args = sys::PJRT_Event_Await_Args {
            event: self.raw,
            ..Args::new()
        };
        pjrt_call!(self.client.plugin_ref(), PJRT_Event_Await, &mut args)
    }

    /// True once the work completed (successfully or not).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = sys::PJRT_Event_IsReady_Args {
            event: self.raw,
            ..Args::new()
        };
        pjrt_call!(self.client.plugin_ref(), PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }

    /// Runs `callback` once the event is ready, with its status: on a plugin thread, or on this
    /// one at once if it is ready already. Keep it short; it must not block on other events.
    pub fn on_ready(&self, callback: impl FnOnce(Result<()>) + Send + 'static) -> Result<()> {
        let pending = Box::new(Pending {
            client: self.client.clone(),
            callback: Box::new(callback),
        });
        let user_arg = Box::into_raw(pending);
        let mut args = sys::PJRT_Event_OnReady_Args {
            event: self.raw,
            callback: Some(on_ready_trampoline),
            user_arg: user_arg.cast(),
            ..Args::new()
        };
        let registered = pjrt_call!(self.client.plugin_ref(), PJRT_Event_OnReady, &mut args);
        if registered.is_err() {
            // The plugin did not take it: reclaim the box (the callback never runs).
            // SAFETY: `user_arg` came from `Box::into_raw` above and was not handed over.
            drop(unsafe { Box::from_raw(user_arg) });
        }
        registered
    }
}
