//! What the API and the dashboard hold of the daemon: the published view (read without asking)
//! and a way to ask the machine (`Handle::ask`), answered once what the ask logged is durable.
//! They send requests and read the view; nothing else.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, RwLock};

use tokio::sync::oneshot;

use crate::ask::{Answer, Ask};
use crate::machine::Input;
use crate::view::{HttpError, View};

/// What reaches the main loop's channel.
#[derive(Debug)]
pub(crate) enum Message {
    /// A user's ask, with where its answer goes.
    Ask(Ask, oneshot::Sender<Answer>),
    /// An input from the driver's threads (executor, collectors, prober).
    Input(Input),
    Shutdown,
}

/// Most messages waiting for the loop; more are refused with 503.
pub(crate) const QUEUE_MAX: usize = 16 * 1024;

#[derive(Clone, Debug)]
pub(crate) struct Handle {
    pub sender: SyncSender<Message>,
    pub view: Arc<RwLock<View>>,
}

fn busy() -> HttpError {
    HttpError::plain(503, "allot is busy: too many requests queued", Some("retry in a moment"))
}

fn stopped() -> HttpError {
    HttpError::plain(500, "allot's main loop has stopped", Some("see the daemon's log; restart it"))
}

impl Handle {
    /// Hands a node agent's samples to the machine without waiting; a full queue is a 503.
    pub(crate) fn post_samples(
        &self,
        samples: Vec<allot_telemetry::Sample>,
    ) -> Result<(), HttpError> {
        let input = Input::Telemetry { samples, groups: std::collections::BTreeMap::new() };
        match self.sender.try_send(Message::Input(input)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(busy()),
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }

    /// Asks the machine; a full queue is a 503, a stopped loop a 500.
    pub(crate) async fn ask(&self, ask: Ask) -> Result<Answer, HttpError> {
        let (tx, rx) = oneshot::channel();
        match self.sender.try_send(Message::Ask(ask, tx)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(busy()),
            Err(TrySendError::Disconnected(_)) => return Err(stopped()),
        }
        rx.await.map_err(|_| {
            HttpError::plain(
                500,
                "allot's main loop stopped before answering",
                Some("see the daemon's log; restart it"),
            )
        })
    }

    pub(crate) async fn submit(&self, ask: Ask) -> Result<allot_api::SubmitResponse, HttpError> {
        match self.ask(ask).await? {
            Answer::Submitted(r) => r,
            other => Err(mismatch(&other)),
        }
    }

    pub(crate) async fn act(&self, ask: Ask) -> Result<allot_api::Workload, HttpError> {
        match self.ask(ask).await? {
            Answer::Workload(r) => r,
            other => Err(mismatch(&other)),
        }
    }

    pub(crate) async fn why(&self, ask: Ask) -> Result<allot_api::Why, HttpError> {
        match self.ask(ask).await? {
            Answer::Why(r) => r,
            other => Err(mismatch(&other)),
        }
    }

    pub(crate) async fn report(&self, ask: Ask) -> Result<allot_api::Report, HttpError> {
        match self.ask(ask).await? {
            Answer::Report(r) => r,
            other => Err(mismatch(&other)),
        }
    }

    pub(crate) async fn policy(&self, ask: Ask) -> Result<allot_api::PolicyView, HttpError> {
        match self.ask(ask).await? {
            Answer::Policy(r) => r,
            other => Err(mismatch(&other)),
        }
    }

    pub(crate) async fn shadow(&self, ask: Ask) -> Result<allot_api::ShadowReport, HttpError> {
        match self.ask(ask).await? {
            Answer::Shadow(r) => r,
            other => Err(mismatch(&other)),
        }
    }

    pub(crate) async fn history(&self, ask: Ask) -> Result<allot_api::HistoryExport, HttpError> {
        match self.ask(ask).await? {
            Answer::History(r) => r,
            other => Err(mismatch(&other)),
        }
    }
}

/// An answer of another kind than asked: a bug, said as one.
fn mismatch(answer: &Answer) -> HttpError {
    HttpError::plain(500, format!("allot answered with the wrong kind: {answer:?}"), None)
}
