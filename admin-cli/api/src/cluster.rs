//! A whole cluster seen from one node: the node's `/v1/cluster` names the live members, and each member's
//! own `/v1/cluster` and `/v1/stats` are read through its `advertise_admin` address with the same secret.
//! `cachectl cluster`, `cachectl stats --cluster` and `cachetop`'s cluster view all start here.

use std::{net::SocketAddr, time::Duration};

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};

use crate::{
    wire::{ClusterCounters, ClusterMember, ClusterView, Stats},
    AdminClient, AdminError, Target,
};

/// A member that has not answered within this is shown unreachable: one dead node must not hold up the view
/// of the others for the client's usual 10 s.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(3);

/// What every member answered, and the sums over those that did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// The admin address asked.
    pub asked: String,
    /// What the asked node answered to `GET /v1/cluster`.
    pub view: ClusterView,
    /// Every member the asked node lists, by name.
    pub members: Vec<MemberReport>,
    /// The statistics of the members that answered, summed ([`Stats::sum`]).
    pub total: Stats,
    /// The cluster counters of the members that answered, summed.
    pub counters: ClusterCounters,
}

/// One member and what it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberReport {
    pub node: String,
    /// Where peers reach its client listener; `-` for the asked node when it is not registered (its lease
    /// lapsed).
    pub advertise: String,
    pub advertise_admin: String,
    /// Its own `GET /v1/cluster`; none when it did not answer.
    pub cluster: Option<ClusterView>,
    /// Its `GET /v1/stats`; none when it did not answer.
    pub stats: Option<Stats>,
    /// Why it is shown unreachable.
    pub error: Option<String>,
}

impl MemberReport {
    pub fn reachable(&self) -> bool {
        self.error.is_none()
    }
}

impl ClusterReport {
    /// Asks `client`'s node for the members, then every member for its view and statistics, all at once.
    /// Fails only when the asked node does: a member that does not answer is reported, not an error.
    pub async fn gather(client: &AdminClient) -> Result<ClusterReport, AdminError> {
        let view = client.cluster().await?;
        let stats = client.stats().await?;
        let mut listed = view.members.clone();
        listed.sort_by(|a, b| a.node.cmp(&b.node));
        let secret = &client.target().secret_file;
        let others = join_all(listed.iter().filter(|m| !m.this).map(|m| async move {
            match ask(m, secret.clone()).await {
                Ok((cluster, stats)) => (Some(cluster), Some(stats), None),
                Err(error) => (None, None, Some(error)),
            }
        }))
        .await;
        let mut others = others.into_iter();
        let mut members: Vec<MemberReport> = listed
            .iter()
            .map(|m| {
                let (cluster, stats, error) = if m.this {
                    (Some(view.clone()), Some(stats.clone()), None)
                } else {
                    others.next().expect("one answer per other member")
                };
                MemberReport {
                    node: m.node.clone(),
                    advertise: m.advertise.clone(),
                    advertise_admin: m.advertise_admin.clone(),
                    cluster,
                    stats,
                    error,
                }
            })
            .collect();
        if !listed.iter().any(|m| m.this) {
            // Its lease lapsed (etcd unreachable, say): not a live member, but the node the operator asked
            // about and the one most likely to be in trouble.
            members.insert(
                0,
                MemberReport {
                    node: view.node.clone(),
                    advertise: "-".into(),
                    advertise_admin: client.target().addr.to_string(),
                    cluster: Some(view.clone()),
                    stats: Some(stats),
                    error: None,
                },
            );
        }
        Ok(Self::new(client.target().addr.to_string(), view, members))
    }

    /// The report of these members' answers, with the sums over those that answered.
    pub fn new(asked: String, view: ClusterView, members: Vec<MemberReport>) -> ClusterReport {
        let total = Stats::sum(members.iter().filter_map(|m| m.stats.as_ref()));
        let mut counters = ClusterCounters::default();
        for c in members.iter().filter_map(|m| m.cluster.as_ref()) {
            counters.add(&c.counters);
        }
        ClusterReport {
            asked,
            view,
            members,
            total,
            counters,
        }
    }

    /// How many members answered.
    pub fn answered(&self) -> usize {
        self.members.iter().filter(|m| m.reachable()).count()
    }
}

/// One member's view and statistics, or why it cannot be had, in a few words.
async fn ask(
    member: &ClusterMember,
    secret_file: std::path::PathBuf,
) -> Result<(ClusterView, Stats), String> {
    let addr = resolve(&member.advertise_admin).await?;
    let client = AdminClient::new(Target { addr, secret_file }).with_timeout(MEMBER_TIMEOUT);
    let (cluster, stats) = tokio::join!(client.cluster(), client.stats());
    Ok((cluster.map_err(reason)?, stats.map_err(reason)?))
}

async fn resolve(advertised: &str) -> Result<SocketAddr, String> {
    let addr = tokio::net::lookup_host(advertised)
        .await
        .map_err(|e| format!("cannot resolve {advertised}: {e}"))?
        .next()
        .ok_or_else(|| format!("{advertised} resolves to no address"))?;
    if addr.ip().is_unspecified() {
        return Err(format!(
            "advertises the wildcard address {advertised}: set [cluster] advertise_admin on that node"
        ));
    }
    Ok(addr)
}

/// The member's name and address are on the same row, so only what went wrong.
fn reason(e: AdminError) -> String {
    match e {
        AdminError::Unreachable { reason, .. } => reason,
        AdminError::Unauthorized { path } => {
            format!(
                "unauthorized: its secret is not the one in {}",
                path.display()
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ClusterState, ProxyStats};

    fn view(node: &str, sent: u64) -> ClusterView {
        ClusterView {
            node: node.into(),
            state: ClusterState::Serving,
            applied_revision: 10,
            seen_revision: 10,
            lag_revisions: 0,
            lag_seconds: 0.0,
            self_routing: false,
            members: Vec::new(),
            counters: ClusterCounters {
                invalidations_sent: sent,
                ..Default::default()
            },
        }
    }

    fn member(node: &str, answered: Option<u64>) -> MemberReport {
        MemberReport {
            node: node.into(),
            advertise: format!("{node}:8080"),
            advertise_admin: format!("{node}:6082"),
            cluster: answered.map(|n| view(node, n)),
            stats: answered.map(|n| Stats {
                version: "0.1.0".into(),
                uptime_seconds: 100 + n,
                proxy: ProxyStats {
                    hits: n,
                    ..Default::default()
                },
                ..Default::default()
            }),
            error: answered.is_none().then(|| "connection refused".into()),
        }
    }

    #[test]
    fn sums_cover_the_members_that_answered() {
        let cases: [(&[Option<u64>], u64, u64, usize); 4] = [
            (&[Some(1)], 1, 101, 1),
            (&[Some(1), Some(20), Some(300)], 321, 101, 3),
            (&[Some(1), None, Some(300)], 301, 101, 2),
            (&[None, None], 0, 0, 0),
        ];
        for (answers, hits, uptime, answered) in cases {
            let members = answers
                .iter()
                .enumerate()
                .map(|(i, a)| member(&format!("n{i}"), *a))
                .collect();
            let r = ClusterReport::new("127.0.0.1:6082".into(), view("n0", 0), members);
            assert_eq!(r.total.proxy.hits, hits, "{answers:?}");
            assert_eq!(r.counters.invalidations_sent, hits, "{answers:?}");
            assert_eq!(r.total.uptime_seconds, uptime, "{answers:?}");
            assert_eq!(r.answered(), answered, "{answers:?}");
        }
    }

    #[test]
    fn a_member_row_says_only_what_went_wrong() {
        let addr: SocketAddr = "127.0.0.3:6082".parse().unwrap();
        let cases = [
            (
                AdminError::Unreachable {
                    addr,
                    reason: "connection refused".into(),
                },
                "connection refused",
            ),
            (
                AdminError::Unauthorized {
                    path: "/var/lib/lacquer/secret".into(),
                },
                "unauthorized: its secret is not the one in /var/lib/lacquer/secret",
            ),
            (
                AdminError::NotClustered { addr },
                "lacquerd at 127.0.0.3:6082 is a single node: its configuration has no [cluster] section",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(reason(error), want);
        }
    }

    #[tokio::test]
    async fn advertised_addresses_resolve_or_say_why_not() {
        let cases = [
            ("127.0.0.2:8081", Ok("127.0.0.2:8081")),
            ("localhost:8081", Ok("127.0.0.1:8081")),
            (
                "0.0.0.0:6082",
                Err("advertises the wildcard address 0.0.0.0:6082: set [cluster] advertise_admin on that node"),
            ),
        ];
        for (advertised, want) in cases {
            let got = resolve(advertised).await.map(|a| a.to_string());
            match want {
                Ok(addr) if advertised.starts_with("localhost") => {
                    let got = got.unwrap();
                    assert!(got == addr || got == "[::1]:8081", "{got}");
                }
                Ok(addr) => assert_eq!(got.unwrap(), addr),
                Err(e) => assert_eq!(got.unwrap_err(), e),
            }
        }
        assert!(resolve("no port").await.is_err());
    }
}
