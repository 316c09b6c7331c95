//! `allot sim pack` (being written).

#[derive(Debug, clap::Args)]
pub(crate) struct PackArgs {}

pub(crate) fn run(_args: &PackArgs) -> anyhow::Result<String> {
    anyhow::bail!("allot sim pack is being written")
}
