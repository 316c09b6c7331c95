//! What every request handler (API and dashboard) is given.

use std::path::PathBuf;
use std::sync::Arc;

use crate::auth::Tokens;
use crate::handle::Handle;
use crate::metrics::Metrics;

#[derive(Clone)]
pub(crate) struct AppState {
    pub handle: Handle,
    pub tokens: Arc<Tokens>,
    pub metrics: Arc<Metrics>,
    pub workload_dir: PathBuf,
    /// The backend's [`allot_backend::Backend::submitter_check`], asked before a submission.
    pub submitter_check: Option<allot_backend::SubmitterCheck>,
    /// The backend's [`allot_backend::Backend::isolation`], for `allot why`.
    pub isolation: Option<String>,
    /// The dashboard's what-if runs; an apply of a candidate keeps the one shown for it.
    pub whatifs: Arc<crate::whatif::Runs>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("workload_dir", &self.workload_dir)
            .field("submitter_check", &self.submitter_check.is_some())
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// The engine's nodes now, for checking a candidate policy against the inventory.
    pub(crate) fn node_specs(&self) -> Vec<allot_core::NodeSpec> {
        self.handle.view.read().map(|v| v.node_specs.clone()).unwrap_or_default()
    }
}
