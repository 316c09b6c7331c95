//! `allot agent`: a node agent that only collects GPU activity on its host and forwards it to
//! the daemon (`POST /api/v1/telemetry`), for backends whose nodes the daemon cannot read
//! itself (Slurm). It decides nothing and keeps nothing: a sample the daemon did not take is
//! replaced by the next one.

use std::time::Duration;

use allot_api::{TelemetryPost, limits};
use allot_telemetry::collect::{Source, local_hostname};
use allot_telemetry::schedule::CollectorSchedule;
use anyhow::Result;

use crate::client::Client;
use crate::{EXIT_USAGE, Failure, RemoteArgs};

#[derive(Debug, clap::Args)]
pub(crate) struct AgentArgs {
    /// Where to read: `nvml`, `sysfs[=ROOT]`, `dcgm-exporter=URL`, `amd-exporter=URL`,
    /// `prometheus-dcgm=URL`, `prometheus-amd=URL`; repeat for several (default: this host's
    /// GPUs through NVML or amdgpu sysfs).
    #[arg(long = "source", value_name = "SPEC")]
    sources: Vec<String>,
    /// This node's name as the daemon's inventory has it (default: the kernel's hostname).
    #[arg(long)]
    hostname: Option<String>,
    /// Time between two reads of each source (a failing one backs off to a minute).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..))]
    interval_ms: u64,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    seconds: Option<u64>,
}

#[allow(clippy::disallowed_methods)] // a live collector: real time is the point
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn run(remote: &RemoteArgs, args: AgentArgs) -> Result<String> {
    let hostname = args.hostname.clone().or_else(local_hostname);
    let mut sources: Vec<Source> = if args.sources.is_empty() {
        Source::local(hostname.clone()).into_iter().collect()
    } else {
        args.sources
            .iter()
            .map(|spec| {
                Source::from_spec(spec, hostname.clone())
                    .map_err(|e| Failure::new(EXIT_USAGE, format!("error: --source {spec}: {e}\n")))
            })
            .collect::<Result<_, _>>()?
    };
    if sources.is_empty() {
        return Err(Failure::new(
            EXIT_USAGE,
            "error: no GPU source on this host (no NVIDIA driver, no amdgpu sysfs) — name one \
             with --source\n",
        )
        .into());
    }
    let client = Client::new(remote)?;
    let start = now_ms();
    let end = args.seconds.map(|s| start.saturating_add(s.saturating_mul(1000)));
    let mut schedules: Vec<CollectorSchedule> = sources
        .iter()
        .map(|_| CollectorSchedule::new(args.interval_ms, 10_000, 60_000, start))
        .collect();
    let (mut posted, mut failed) = (0u64, 0u64);
    loop {
        let now = now_ms();
        if end.is_some_and(|e| now >= e) {
            break;
        }
        for (source, schedule) in sources.iter_mut().zip(schedules.iter_mut()) {
            if !schedule.is_due(now) {
                continue;
            }
            let sent =
                source.collect(now).map_err(anyhow::Error::msg).and_then(|(samples, warnings)| {
                    for w in warnings {
                        crate::print_err(&format!("warning: {}: {w}\n", source.name()));
                    }
                    let wire: Vec<_> =
                        samples.iter().filter_map(allot_server::telemetry::to_wire).collect();
                    for chunk in wire.chunks(limits::TELEMETRY_SAMPLES_MAX) {
                        let post = TelemetryPost { samples: chunk.to_vec() };
                        client.post_accepted("/telemetry", &post)?;
                    }
                    Ok(wire.len() as u64)
                });
            match sent {
                Ok(n) => {
                    schedule.record_success(now);
                    posted += n;
                }
                Err(e) => {
                    schedule.record_failure(now);
                    failed += 1;
                    if schedule.consecutive_failures() == 1 {
                        crate::print_err(&format!(
                            "warning: {}: {e:#} (retrying with backoff)\n",
                            source.name()
                        ));
                    }
                }
            }
        }
        let next = schedules.iter().map(CollectorSchedule::next_due_ms).min().unwrap_or(now + 1000);
        let next = end.map_or(next, |e| next.min(e));
        std::thread::sleep(Duration::from_millis(next.saturating_sub(now_ms()).clamp(10, 1000)));
    }
    Ok(format!("{posted} samples posted, {failed} failed collections or posts\n"))
}
