//! Bearer tokens: `allot_<id>_<secret>`, stored as the SHA-256 of the whole token, with a role
//! (admin, member of some projects, viewer). The rules of who may do what live here, in one
//! place, and the authorisation matrix test checks them through the HTTP API.

use std::collections::BTreeMap;
use std::sync::Mutex;

use allot_api::{Role, TokenCreated, TokenRequest};
use allot_store::{Store, TokenRecord};

use crate::view::HttpError;
use sha2::{Digest, Sha256};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub token_id: String,
    pub name: String,
    pub role: Role,
    pub projects: Vec<String>,
}

impl Principal {
    /// May see this project's workloads.
    pub fn can_see(&self, project: &str) -> bool {
        match self.role {
            Role::Admin | Role::Viewer => true,
            Role::Member => self.projects.iter().any(|p| p == project),
        }
    }

    /// May submit to / act on this project's workloads.
    pub fn can_act(&self, project: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Viewer => false,
            Role::Member => self.projects.iter().any(|p| p == project),
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

pub(crate) fn hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("no randomness for a token: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Checks a token request (names, projects) against the known projects.
pub(crate) fn check_request(request: &TokenRequest, projects: &[String]) -> Result<(), HttpError> {
    // 400 for what the API's schema bounds (the name), 422 for what only the policy can say.
    let refuse = |status: u16, field: &str, error: String, fix: &str| {
        let body = allot_api::ApiError {
            error,
            field: Some(field.to_string()),
            fix: Some(fix.to_string()),
        };
        HttpError::new(status, body)
    };
    let bad = |field: &str, error: String, fix: &str| refuse(422, field, error, fix);
    let chars = request.name.chars().count();
    if chars == 0
        || chars > allot_api::limits::NAME_CHARS_MAX
        || request.name.chars().any(char::is_control)
    {
        return Err(refuse(
            400,
            "name",
            "a token needs a printable name of 1 to 200 characters".into(),
            "name who holds it, e.g. --name alice",
        ));
    }
    match request.role {
        Role::Member if request.projects.is_empty() => {
            return Err(bad(
                "projects",
                "a member token needs at least one project".into(),
                "add --project NAME",
            ));
        }
        Role::Admin | Role::Viewer if !request.projects.is_empty() => {
            return Err(bad(
                "projects",
                format!("a {} token sees every project", request.role.as_str()),
                "leave the projects out, or make it a member token",
            ));
        }
        _ => {}
    }
    if !projects.is_empty() {
        for (i, p) in request.projects.iter().enumerate() {
            if !projects.contains(p) {
                return Err(bad(
                    &format!("projects[{i}]"),
                    format!("no project {p:?}"),
                    &format!("known: {}", projects.join(", ")),
                ));
            }
        }
    }
    Ok(())
}

/// Makes a token, stores its hash, returns the secret (shown once).
pub(crate) fn create(
    store: &mut dyn Store,
    request: &TokenRequest,
    now_ms: u64,
) -> anyhow::Result<TokenCreated> {
    let id = random_hex(4)?;
    let token = format!("allot_{id}_{}", random_hex(20)?);
    store.put_token(&TokenRecord {
        id: id.clone(),
        hash: hash(&token),
        role: request.role.as_str().to_string(),
        projects: request.projects.clone(),
        name: request.name.clone(),
        created_ms: now_ms,
        revoked: false,
    })?;
    Ok(TokenCreated {
        id,
        token,
        role: request.role.clone(),
        name: request.name.clone(),
        projects: request.projects.clone(),
    })
}

/// Token lookups for the API: a cache in front of a read connection of its own, so a token
/// made offline (`allot token create --data-dir`) works without a restart.
pub(crate) struct Tokens {
    cache: Mutex<BTreeMap<String, Principal>>,
    store: Mutex<Box<dyn Store>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens")
    }
}

impl Tokens {
    pub(crate) fn new(store: Box<dyn Store>) -> Tokens {
        Tokens { cache: Mutex::new(BTreeMap::new()), store: Mutex::new(store) }
    }

    /// The principal behind `Authorization: Bearer TOKEN`, if the token is known and live.
    pub(crate) fn principal(&self, token: &str) -> Option<Principal> {
        if !token.starts_with("allot_") || token.len() > 200 {
            return None;
        }
        let h = hash(token);
        if let Some(p) = self.cache.lock().ok()?.get(&h) {
            return Some(p.clone());
        }
        let record = self.store.lock().ok()?.token_by_hash(&h).ok()??;
        if record.revoked {
            return None;
        }
        let principal = Principal {
            token_id: record.id,
            name: record.name,
            role: Role::parse(&record.role)?,
            projects: record.projects,
        };
        self.cache.lock().ok()?.insert(h, principal.clone());
        Some(principal)
    }

    pub(crate) fn create(
        &self,
        request: &TokenRequest,
        now_ms: u64,
    ) -> anyhow::Result<TokenCreated> {
        let mut store = self.store.lock().map_err(|_| anyhow::anyhow!("token store poisoned"))?;
        create(store.as_mut(), request, now_ms)
    }
}
