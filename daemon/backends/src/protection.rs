//! Deny rules (`[[deny]]`) and per-client rate limits (a route's `rate_limit`): the WAF and DDoS-shield uses
//! operators put a cache in front for.

use std::{net::IpAddr, num::NonZeroU32, time::Duration};

use governor::{clock::Clock, DefaultKeyedRateLimiter, Quota, RateLimiter};
use http::{header::HeaderName, request::Parts, Method};
use ipnet::IpNet;
use regex::Regex;

use lacquer_config::{Deny, RateLimit};
use lacquer_policy::normalize;

/// One `[[deny]]` rule, compiled.
#[derive(Debug)]
pub struct DenyRule {
    methods: Vec<Method>,
    path: Option<Regex>,
    header: Option<(HeaderName, Option<Regex>)>,
    clients: Vec<IpNet>,
    except_clients: Vec<IpNet>,
}

impl DenyRule {
    /// Fails with a message naming the bad part; `--check` and reload report it.
    pub fn compile(rule: &Deny) -> Result<Self, String> {
        let regex = |re: &str, key: &str| {
            Regex::new(re).map_err(|e| format!("{key}: {e}").replace('\n', " "))
        };
        let methods = rule
            .methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| format!("methods: {m:?} is not a method"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let path = rule
            .path_regex
            .as_deref()
            .map(|re| regex(re, "path_regex"))
            .transpose()?;
        let header = match (&rule.header, &rule.header_regex) {
            (None, None) => None,
            (None, Some(_)) => return Err("header_regex needs header".into()),
            (Some(name), re) => {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("header: {name:?} is not a header name"))?;
                Some((
                    name,
                    re.as_deref()
                        .map(|re| regex(re, "header_regex"))
                        .transpose()?,
                ))
            }
        };
        if methods.is_empty() && path.is_none() && header.is_none() && rule.clients.is_empty() {
            return Err("a deny rule needs at least one condition".into());
        }
        Ok(Self {
            methods,
            path,
            header,
            clients: rule.clients.clone(),
            except_clients: rule.except_clients.clone(),
        })
    }

    /// Every condition given holds for this request from `client` (the PROXY protocol's client where the
    /// listener expects it); `path_regex` is searched in the path and query, as sent (normalised) and as a
    /// lenient origin reads it ([`normalize::lenient`]): either matching denies.
    pub fn matches(&self, parts: &Parts, client: IpAddr) -> bool {
        (self.methods.is_empty() || self.methods.contains(&parts.method))
            && self.path.as_ref().is_none_or(|re| {
                let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                re.is_match(target) || normalize::lenient(target).is_some_and(|t| re.is_match(&t))
            })
            && self.header.as_ref().is_none_or(|(name, re)| {
                let mut values = parts.headers.get_all(name).iter();
                match re {
                    None => values.next().is_some(),
                    Some(re) => values.any(|v| re.is_match(&String::from_utf8_lossy(v.as_bytes()))),
                }
            })
            && (self.clients.is_empty() || self.clients.iter().any(|n| n.contains(&client)))
            && !self.except_clients.iter().any(|n| n.contains(&client))
    }
}

/// A route's token buckets, one per client address.
pub struct ClientRateLimit {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
}

impl std::fmt::Debug for ClientRateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientRateLimit")
            .field("clients", &self.limiter.len())
            .finish()
    }
}

impl ClientRateLimit {
    /// Fails with the message for `rate_limit` when `requests`, `burst` or `per` is zero.
    pub(crate) fn new(limit: &RateLimit) -> Result<Self, String> {
        let requests = NonZeroU32::new(limit.requests).ok_or("requests must be above 0")?;
        let burst = NonZeroU32::new(limit.burst.unwrap_or(limit.requests))
            .ok_or("burst must be above 0")?;
        let period = limit.per / requests.get();
        let quota = Quota::with_period(period)
            .ok_or("per must be above 0")?
            .allow_burst(burst);
        Ok(Self {
            limiter: RateLimiter::keyed(quota),
        })
    }

    /// `Err(wait)` when the client has no token left: how long until it has one.
    pub fn check(&self, client: IpAddr) -> Result<(), Duration> {
        self.limiter
            .check_key(&client)
            .map_err(|not_until| not_until.wait_time_from(self.limiter_clock_now()))
    }

    fn limiter_clock_now(&self) -> governor::clock::QuantaInstant {
        governor::clock::DefaultClock::default().now()
    }

    /// Forgets clients whose buckets are full again, so the table does not grow with every address seen.
    pub fn forget_idle(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn deny_rules_need_every_condition() {
        let rule = |d: Deny| DenyRule::compile(&d).unwrap();
        let scanner = rule(Deny {
            header: Some("User-Agent".into()),
            header_regex: Some("(?i)sqlmap|nikto".into()),
            ..Default::default()
        });
        let admin = rule(Deny {
            path_regex: Some("^/admin".into()),
            clients: vec!["0.0.0.0/0".parse().unwrap()],
            methods: vec!["get".into(), "POST".into()],
            ..Default::default()
        });
        let admin_but_office = rule(Deny {
            path_regex: Some("^/admin".into()),
            except_clients: vec!["10.0.0.0/8".parse().unwrap()],
            ..Default::default()
        });
        let no_ua = rule(Deny {
            header: Some("x-debug".into()),
            ..Default::default()
        });
        let inside: IpAddr = "10.1.2.3".parse().unwrap();
        let cases = [
            (
                &scanner,
                request("GET", "/", &[("user-agent", "sqlmap/1.7")]),
                true,
            ),
            (
                &scanner,
                request("GET", "/", &[("user-agent", "Mozilla/5.0")]),
                false,
            ),
            (&scanner, request("GET", "/", &[]), false),
            (&admin, request("GET", "/admin/users", &[]), true),
            (&admin, request("DELETE", "/admin/users", &[]), false),
            (&admin, request("GET", "/public/admin", &[]), false),
            (&admin, request("GET", "/%2Fadmin", &[]), true),
            (&admin, request("GET", "/%5Cadmin", &[]), true),
            (&admin, request("GET", "/;/admin", &[]), true),
            (&admin, request("GET", "/.;/admin", &[]), true),
            (&admin, request("GET", "/public%2F..%2Fadmin", &[]), true),
            (&admin, request("GET", "/public/a;b", &[]), false),
            (&no_ua, request("GET", "/", &[("X-Debug", "")]), true),
            (&no_ua, request("GET", "/", &[]), false),
        ];
        for (rule, parts, want) in cases {
            assert_eq!(
                rule.matches(&parts, inside),
                want,
                "{} {}",
                parts.method,
                parts.uri
            );
        }
        let outside = rule(Deny {
            clients: vec!["192.0.2.0/24".parse().unwrap()],
            ..Default::default()
        });
        assert!(outside.matches(&request("GET", "/", &[]), "192.0.2.9".parse().unwrap()));
        assert!(!outside.matches(&request("GET", "/", &[]), inside));
        let admin_page = request("GET", "/admin", &[]);
        assert!(!admin_but_office.matches(&admin_page, inside));
        assert!(admin_but_office.matches(&admin_page, "192.0.2.9".parse().unwrap()));
        for (bad, want) in [
            (Deny::default(), "at least one condition"),
            (
                Deny {
                    path_regex: Some("(".into()),
                    ..Default::default()
                },
                "path_regex: regex parse error",
            ),
            (
                Deny {
                    header_regex: Some("x".into()),
                    ..Default::default()
                },
                "header_regex needs header",
            ),
            (
                Deny {
                    methods: vec!["G T".into()],
                    ..Default::default()
                },
                "is not a method",
            ),
        ] {
            let e = DenyRule::compile(&bad).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn a_client_gets_its_burst_then_waits_and_others_are_not_affected() {
        let limit = ClientRateLimit::new(&RateLimit {
            requests: 2,
            per: Duration::from_secs(10),
            burst: Some(3),
        })
        .unwrap();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..3 {
            assert!(limit.check(a).is_ok());
        }
        let wait = limit.check(a).unwrap_err();
        assert!(
            wait > Duration::from_secs(4) && wait <= Duration::from_secs(5),
            "{wait:?}"
        );
        assert!(limit.check(b).is_ok());
        assert!(ClientRateLimit::new(&RateLimit {
            requests: 0,
            per: Duration::from_secs(1),
            burst: None
        })
        .is_err());
    }
}
