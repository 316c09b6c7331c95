//! Glue to `allot-server`: `allot serve` and the offline `allot token create --data-dir`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use allot_api::{Role, TokenCreated, TokenRequest};
use anyhow::Result;
use clap::ValueEnum;

use crate::client::Client;
use crate::{EXIT_INVALID, Failure, Output, RemoteArgs};

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Where the daemon keeps its state (event log, snapshots, tokens, logs); default: the
    /// platform's data directory for allot.
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:7380", value_name = "ADDR:PORT")]
    pub(crate) listen: SocketAddr,
    /// Declared nodes and GPUs (cluster YAML), for when this host's GPUs cannot be discovered
    /// (default: the embedded examples/cluster.yaml).
    #[arg(long = "inventory", value_name = "FILE")]
    pub(crate) inventory_file: Option<PathBuf>,
    /// Policy YAML (default: the embedded examples/policy.yaml).
    #[arg(long = "policy", value_name = "FILE")]
    pub(crate) policy_file: Option<PathBuf>,
    /// PEM certificate chain to serve HTTPS with (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Least time between two decision cycles, in milliseconds. A cycle runs as soon as work
    /// changed and this much time has passed since the last (and every 5 s regardless).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub(crate) decide_interval_ms: u64,
    /// How often node states and foreign work are read from the backend (`200ms`, `5s`).
    /// Default: 5s; with --backend kubernetes 200ms, since that backend reads a view its
    /// watches keep in memory and answers "nothing new" at no cost when nothing changed.
    #[arg(long, value_name = "DURATION", value_parser = parse_cluster_watch_ms)]
    pub(crate) cluster_watch: Option<u64>,
    /// The signal sent to a checkpointable workload before it is stopped.
    #[arg(long, default_value = "SIGUSR1", value_name = "SIGNAL")]
    pub(crate) checkpoint_signal: String,
    /// Log records between two snapshots of the state (taken right after a decision cycle,
    /// or after a hundredth as many cycles, which cost a replay most); a restart replays at
    /// most about this many, and the log before the previous snapshot is dropped.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) snapshot_every: u64,
    /// Where GPU activity is read: `nvml`, `sysfs[=ROOT]`, `dcgm-exporter=URL`,
    /// `amd-exporter=URL`, `prometheus-dcgm=URL`, `prometheus-amd=URL`, or `none`; repeat for
    /// several. Default: this host's GPUs (NVML, else amdgpu sysfs) when it has any. Node
    /// agents (`allot agent`) may post more.
    #[arg(long = "telemetry", value_name = "SPEC")]
    pub(crate) telemetry: Vec<String>,
    /// Post events to this URL as JSON: a scoped policy rollout that rolled itself back
    /// because a rollback condition tripped (`allot policy apply FILE --scope … --rollback-if …`).
    #[arg(long, value_name = "URL")]
    pub(crate) policy_webhook: Option<String>,
    /// What runs the workloads: `local` (this host, processes), `slurm` (a Slurm cluster:
    /// its nodes and GRES GPUs are the inventory; each run is a held job released onto the
    /// nodes allot chose) or `kubernetes` (allot schedules the pods that ask for
    /// `schedulerName: allot`; projects are namespaces).
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    pub(crate) backend: BackendArg,
    /// With --backend slurm: the partition jobs go to (default: Slurm's default partition).
    #[arg(long, value_name = "NAME")]
    pub(crate) slurm_partition: Option<String>,
    /// With --backend slurm: a partition allot leaves alone; repeat for several.
    #[arg(long, value_name = "NAME")]
    pub(crate) slurm_unmanaged_partition: Vec<String>,
    /// With --backend slurm: the cluster's slurm.conf (default: $SLURM_CONF, else Slurm's own).
    #[arg(long, value_name = "FILE")]
    pub(crate) slurm_conf: Option<PathBuf>,
    /// With --backend slurm: run each job as the Unix account named like the allot user who
    /// submitted it (`sbatch --uid`; allot must run as root). Default: as allot's own user.
    #[arg(long)]
    pub(crate) slurm_run_as_submitter: bool,
    /// With --backend slurm: the longest pause between two looks at the queue (`squeue`),
    /// from 250ms to 60s. allot looks again every 250 ms after a change and backs off, doubling,
    /// to this while nothing changes (to --slurm-poll-waiting while work waits for GPUs): a
    /// shorter pause sees ends sooner (GPUs idle less) at the price of more calls to slurmctld.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_slurm_poll_ms)]
    pub(crate) slurm_poll_max: u64,
    /// With --backend slurm: the longest pause between two looks at the queue while work waits
    /// for GPUs, from 250ms to 60s. Slurm starts nothing allot did not release, so a job's end
    /// seen late leaves its GPUs idle until allot sees it; raise this where `squeue` is costly
    /// (a queue of many thousands of jobs).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_slurm_poll_ms)]
    pub(crate) slurm_poll_waiting: u64,
    /// With --backend kubernetes: the kubeconfig (default: $KUBECONFIG, else ~/.kube/config,
    /// else the pod's in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// With --backend kubernetes: the container image that work submitted through allot
    /// (`allot submit`) runs in, as one pod per member made by allot. Without it, such work
    /// fails to launch, saying so; pods that ask for `schedulerName: allot` need no image here.
    #[arg(long, value_name = "IMAGE")]
    pub(crate) kubernetes_image: Option<String>,
    /// Where workloads' own files go (logs, heartbeat and checkpoint files), outside the
    /// private data directory. Default: DATA_DIR/workloads when every workload runs as allot's
    /// own account, else DATA_DIR-workloads beside it (every directory above must let the
    /// workloads' accounts pass).
    #[arg(long, value_name = "DIR")]
    pub(crate) workload_dir: Option<PathBuf>,
    /// Run every local workload as allot's own Unix account on purpose. Without it, allot run
    /// as root starts each workload as the account named like its submitter, and allot run as
    /// another user warns at start that all workloads share its account.
    #[arg(long)]
    pub(crate) single_user: bool,
}

/// `--cluster-watch`: a duration from 10ms to 60s, in ms.
fn parse_cluster_watch_ms(text: &str) -> Result<u64, String> {
    let ms = allot_config::duration_ms(text)?;
    if !(10..=60_000).contains(&ms) {
        return Err(format!("{text}: write a duration from 10ms to 60s"));
    }
    Ok(ms)
}

/// `--slurm-poll-max`, `--slurm-poll-waiting`: a duration from 250ms to 60s, in ms.
fn parse_slurm_poll_ms(text: &str) -> Result<u64, String> {
    let ms = allot_config::duration_ms(text)?;
    if !(250..=60_000).contains(&ms) {
        return Err(format!("{text}: write a duration from 250ms to 60s"));
    }
    Ok(ms)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendArg {
    Local,
    Slurm,
    Kubernetes,
}

pub(crate) fn serve(args: ServeArgs) -> Result<String> {
    let data_dir = match args.data_dir {
        Some(dir) => dir,
        None => allot_server::default_data_dir()?,
    };
    allot_server::run(allot_server::ServeConfig {
        data_dir,
        listen: args.listen,
        inventory_file: args.inventory_file,
        policy_file: args.policy_file,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        decide_interval_ms: args.decide_interval_ms,
        cluster_watch_ms: args.cluster_watch,
        checkpoint_signal: args.checkpoint_signal,
        snapshot_every: args.snapshot_every,
        telemetry: args.telemetry,
        policy_webhook: args.policy_webhook,
        workload_dir: args.workload_dir,
        single_user: args.single_user,
        backend: match args.backend {
            BackendArg::Local => allot_server::BackendChoice::Local,
            BackendArg::Slurm => allot_server::BackendChoice::Slurm {
                partition: args.slurm_partition,
                unmanaged_partitions: args.slurm_unmanaged_partition,
                slurm_conf: args.slurm_conf,
                run_as_submitter: args.slurm_run_as_submitter,
                poll_max_ms: args.slurm_poll_max,
                poll_while_waiting_ms: args.slurm_poll_waiting,
            },
            BackendArg::Kubernetes => allot_server::BackendChoice::Kubernetes {
                kubeconfig: args.kubeconfig,
                image: args.kubernetes_image,
            },
        },
    })?;
    Ok(String::new())
}

#[derive(Debug, clap::Args)]
pub(crate) struct TokenCreateArgs {
    /// What the token may do.
    #[arg(long, value_enum)]
    pub(crate) role: RoleArg,
    /// Who holds it (becomes the `user` of what it submits).
    #[arg(long)]
    pub(crate) name: String,
    /// A project a member token may see and act on; repeatable.
    #[arg(long = "project", value_name = "PROJECT")]
    pub(crate) projects: Vec<String>,
    /// Create it offline in this data directory (the daemon's --data-dir) instead of through
    /// the API.
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Output format: the token alone on stdout (text) or the TokenCreated answer (json).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum RoleArg {
    Admin,
    Member,
    Viewer,
}

pub(crate) fn token_create(remote: &RemoteArgs, args: &TokenCreateArgs) -> Result<String> {
    let role = match args.role {
        RoleArg::Admin => Role::Admin,
        RoleArg::Member => Role::Member,
        RoleArg::Viewer => Role::Viewer,
    };
    if role == Role::Member && args.projects.is_empty() {
        return Err(Failure::new(
            EXIT_INVALID,
            "error: a member token with no --project can see nothing — fix: add --project NAME (repeatable)\n",
        )
        .into());
    }
    let request = TokenRequest { role, name: args.name.clone(), projects: args.projects.clone() };
    let (created, raw) = match &args.data_dir {
        Some(dir) => {
            let created = allot_server::create_token(dir, &request)?;
            let raw = serde_json::to_value(&created)?;
            (created, raw)
        }
        None => {
            let json = Client::new(remote)?.post::<TokenCreated>("/tokens", Some(&request))?;
            (json.value, json.raw)
        }
    };
    Ok(match args.output {
        Output::Json => {
            let mut text = serde_json::to_string_pretty(&raw)?;
            text.push('\n');
            text
        }
        Output::Text => {
            // The token alone on stdout, so `TOKEN=$(allot token create …)` works; what it is
            // goes to stderr.
            let mut note =
                format!("token {} for {} ({}", created.id, created.name, created.role.as_str());
            if !created.projects.is_empty() {
                let _ = write!(note, ", projects {}", created.projects.join(","));
            }
            note.push_str("); shown once, keep it\n");
            crate::print_err(&note);
            format!("{}\n", created.token)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_poll_pauses_take_250ms_to_60s() {
        assert_eq!(parse_slurm_poll_ms("500ms"), Ok(500));
        assert_eq!(parse_slurm_poll_ms("5s"), Ok(5_000));
        assert_eq!(parse_slurm_poll_ms("1m"), Ok(60_000));
        let short = parse_slurm_poll_ms("100ms").expect_err("too short");
        assert!(short.contains("from 250ms to 60s"), "{short}");
        assert!(parse_slurm_poll_ms("2m").is_err());
        assert!(parse_slurm_poll_ms("soon").is_err());
    }
}
