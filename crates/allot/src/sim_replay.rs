//! `allot sim replay` (being written).

#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {}

pub(crate) fn run(_args: &ReplayArgs) -> anyhow::Result<String> {
    anyhow::bail!("allot sim replay is being written")
}
