//! What every request handler (API and dashboard) is given.

use std::path::PathBuf;
use std::sync::Arc;

use crate::auth::Tokens;
use crate::handle::Handle;
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub(crate) struct AppState {
    pub handle: Handle,
    pub tokens: Arc<Tokens>,
    pub metrics: Arc<Metrics>,
    pub data_dir: PathBuf,
}

impl AppState {
    /// The engine's nodes now, for checking a candidate policy against the inventory.
    pub(crate) fn node_specs(&self) -> Vec<allot_core::NodeSpec> {
        self.handle.view.read().map(|v| v.node_specs.clone()).unwrap_or_default()
    }
}
