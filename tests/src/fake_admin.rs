//! Admin APIs of a cluster's members, scripted: each member answers `GET /v1/cluster` with the document the
//! test gives it (plus its name and the member list) and `GET /v1/stats` with its statistics, behind the
//! shared secret, as the operator tools see a cluster of `lacquerd`s.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
};

use serde_json::{json, Value};

use crate::{unused_addr, Origin, Reply};

/// One member to fake: its `/v1/cluster` fields other than `node` and `members` (`state`, revisions,
/// `counters`…) and its `/v1/stats` document; `None` for a member that is listed but does not answer.
pub struct Member {
    pub node: &'static str,
    pub answers: Option<(Value, Value)>,
    /// In the member lists (its lease held); a node whose lease lapsed still answers but is not listed.
    pub listed: bool,
}

impl Member {
    pub fn up(node: &'static str, view: Value, stats: Value) -> Member {
        Member {
            node,
            answers: Some((view, stats)),
            listed: true,
        }
    }

    /// Listed, but nothing listens on its admin address.
    pub fn down(node: &'static str) -> Member {
        Member {
            node,
            answers: None,
            listed: true,
        }
    }

    pub fn unlisted(self) -> Member {
        Member {
            listed: false,
            ..self
        }
    }
}

pub struct FakeCluster {
    /// Every member's admin address, in the order given; nothing listens on a silent member's.
    pub admins: Vec<SocketAddr>,
    /// The origins standing in for the answering members (by position; `None` for silent ones).
    pub members: Vec<Option<Origin>>,
    stats: Vec<Option<Arc<Mutex<Value>>>>,
    _dir: tempfile::TempDir,
    pub secret_file: PathBuf,
}

pub const SECRET: &str = "fake-cluster-secret-0123456789abcdef";

impl FakeCluster {
    pub async fn start(members: Vec<Member>) -> FakeCluster {
        let dir = tempfile::tempdir().expect("secret directory");
        let secret_file = dir.path().join("secret");
        std::fs::write(&secret_file, format!("{SECRET}\n")).expect("secret written");
        // Every member lists every other, so the list is known only once they all listen.
        let list: Arc<OnceLock<Vec<(String, SocketAddr)>>> = Arc::default();
        let mut admins = Vec::new();
        let mut origins = Vec::new();
        let mut stats = Vec::new();
        let nodes: Vec<(&str, bool)> = members.iter().map(|m| (m.node, m.listed)).collect();
        for member in members {
            let Some((view, document)) = member.answers else {
                admins.push(unused_addr());
                origins.push(None);
                stats.push(None);
                continue;
            };
            let document = Arc::new(Mutex::new(document));
            let (node, list, served) = (member.node, list.clone(), document.clone());
            let origin = Origin::start(move |seen| {
                let authorized = seen
                    .headers
                    .get("authorization")
                    .is_some_and(|v| v.as_bytes() == format!("Bearer {SECRET}").as_bytes());
                if !authorized {
                    return error(401, "unauthorized", "missing or wrong secret");
                }
                match seen.path.as_str() {
                    "/v1/cluster" => {
                        let mut view = view.clone();
                        view["node"] = node.into();
                        view["members"] = list
                            .get()
                            .expect("the member list is set before anyone is asked")
                            .iter()
                            .map(|(name, admin)| {
                                json!({
                                    "node": name,
                                    "advertise": format!("{}:8080", admin.ip()),
                                    "advertise_admin": admin.to_string(),
                                    "this": name == node,
                                })
                            })
                            .collect();
                        Reply::ok(view.to_string())
                    }
                    "/v1/stats" => Reply::ok(served.lock().unwrap().to_string()),
                    _ => error(404, "not_found", "no such admin route"),
                }
            })
            .await;
            admins.push(origin.addr);
            origins.push(Some(origin));
            stats.push(Some(document));
        }
        let names = nodes
            .iter()
            .zip(&admins)
            .filter(|((_, listed), _)| *listed)
            .map(|((node, _), addr)| (node.to_string(), *addr))
            .collect();
        list.set(names).expect("set once");
        FakeCluster {
            admins,
            members: origins,
            stats,
            _dir: dir,
            secret_file,
        }
    }

    /// Replaces what member `i` answers to `/v1/stats`.
    pub fn set_stats(&self, i: usize, document: Value) {
        let served = self.stats[i].as_ref().expect("an answering member");
        *served.lock().unwrap() = document;
    }
}

fn error(status: u16, code: &str, message: &str) -> Reply {
    Reply::ok(json!({"code": code, "message": message}).to_string()).status(status)
}

/// A `/v1/cluster` document's own fields, as the contract lists them.
pub fn view(state: &str, applied: u64, seen: u64, lag_seconds: f64, sent: u64) -> Value {
    json!({
        "state": state,
        "applied_revision": applied,
        "seen_revision": seen,
        "lag_revisions": seen - applied,
        "lag_seconds": lag_seconds,
        "self_routing": false,
        "counters": {
            "invalidations_sent": sent, "invalidations_applied": applied, "compactions": 0,
            "watch_breaks": 1, "hits_revalidated_for_lag": 0, "peer_fetches": 0, "peer_failures": 0,
            "forwarded_in": 0
        }
    })
}
