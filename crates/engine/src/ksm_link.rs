//! What the KSM handoff (ksm.rs) knows of kernel KSM: whether ksmd runs.
//!
//! `/sys/kernel/mm/ksm/run` is opened the first time a scan asks, which is
//! only once the mapping budget refuses a merge, and then kept, so that no
//! later scan opens a file (a descriptor opened at the moment a program
//! forks would show in its child). Each scan reads it once at most, and only
//! if the handoff is on: the answer holds until the next scan begins.

use crate::config::Config;
use crate::sys;

pub(crate) struct KsmLink {
    /// The handoff is configured on (`Config::ksm_handoff`) and not injected off.
    handoff: bool,
    /// Says whether ksmd runs: None until first asked, then kept (None
    /// inside if it could not be opened).
    run: Option<Option<sys::KsmRun>>,
    /// Whether this scan may hand blocks to kernel KSM, once asked.
    ready: Option<bool>,
}

impl KsmLink {
    pub(crate) fn new(cfg: &Config) -> KsmLink {
        KsmLink {
            handoff: cfg.ksm_handoff && !cfg.inject.ksm_off,
            run: None,
            ready: None,
        }
    }

    /// Whether blocks may be handed over in this scan: the handoff is on and
    /// ksmd runs. Read the first time a scan asks.
    pub(crate) fn ready(&mut self) -> bool {
        if let Some(ready) = self.ready {
            return ready;
        }
        let ready = self.handoff && self.ksmd_runs();
        self.ready = Some(ready);
        ready
    }

    fn ksmd_runs(&mut self) -> bool {
        self.run
            .get_or_insert_with(|| sys::KsmRun::open().ok())
            .as_ref()
            .is_some_and(sys::KsmRun::running)
    }

    /// A scan begins: ksmd is asked afresh when it matters.
    pub(crate) fn begin_scan(&mut self) {
        self.ready = None;
    }
}
