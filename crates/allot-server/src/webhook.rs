//! Operator events posted to a webhook (`allot serve --policy-webhook URL`): today, a rollout
//! that rolled itself back. Best effort and outside the main loop: each event is one JSON
//! `POST` from its own thread, tried three times; a failure is written to the log stream and
//! never holds up a decision (the log and `/metrics` carry the same event).

use std::time::Duration;

/// How long one delivery may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Tries per event, a second apart.
const TRIES: u32 = 3;

#[derive(Clone, Debug)]
pub(crate) struct Webhook {
    url: String,
}

impl Webhook {
    /// An `http://` or `https://` URL, else why not.
    pub(crate) fn new(url: &str) -> Result<Webhook, String> {
        if url.starts_with("http://") || url.starts_with("https://") {
            Ok(Webhook { url: url.to_string() })
        } else {
            Err(format!(
                "--policy-webhook {url:?} is not an http:// or https:// address — fix: e.g. \
                 https://hooks.example.org/allot"
            ))
        }
    }

    /// Posts `event` (JSON) in the background.
    pub(crate) fn send(&self, event: serde_json::Value) {
        let url = self.url.clone();
        let spawned = std::thread::Builder::new().name("allot-webhook".into()).spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(TIMEOUT))
                .user_agent(concat!("allot/", env!("CARGO_PKG_VERSION")))
                .build()
                .into();
            let body = event.to_string();
            let mut last = String::new();
            for attempt in 1..=TRIES {
                match agent.post(&url).header("Content-Type", "application/json").send(&body) {
                    Ok(_) => return,
                    Err(e) => last = e.to_string(),
                }
                if attempt < TRIES {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            crate::os::tracing_log(&format!(
                "the policy webhook {url} did not take an event after {TRIES} tries: {last}"
            ));
        });
        if let Err(e) = spawned {
            crate::os::tracing_log(&format!("no thread for the policy webhook: {e}"));
        }
    }
}
