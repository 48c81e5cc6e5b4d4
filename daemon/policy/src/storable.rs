//! Whether a response may be stored, and for how long (RFC 9111 §3, §4.2, §5.2.2).

use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, StatusCode};

use super::{
    cache_control::CacheControl,
    freshness::{self, Lifetime},
    vary::{self, Vary},
    Policy,
};

/// How long a storable response lives, and what selects it among the URL's variants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storable {
    /// Freshness lifetime, counted from when the origin generated the response: a route's `ttl`, else
    /// [`freshness::lifetime`]; zero for `no-cache` (stored only to be revalidated).
    pub ttl: Duration,
    /// How long past freshness the object may be served while one background fetch refreshes it: a
    /// route's `grace`, else `stale-while-revalidate`, else `cache.default_grace`; zero when `no_stale`.
    pub grace: Duration,
    /// How long past grace the object is kept for a miss to revalidate (`cache.keep`).
    pub keep: Duration,
    /// How long past freshness the object may stand in for a failing origin.
    pub stale_if_error: Duration,
    /// Never serve stale: `must-revalidate`, `proxy-revalidate`, `s-maxage` (which implies it for a shared
    /// cache) or `no-cache`.
    pub no_stale: bool,
    /// Lower-cased `Vary` names; empty when the response does not vary.
    pub vary: Vec<String>,
}

/// The origin's directive that forbids serving a response stale, if one does: `no-cache` (unless a route's
/// TTL replaced it: `no_cache` says whether it still holds), `must-revalidate`, `proxy-revalidate`, or
/// `s-maxage`, which carries proxy-revalidate's meaning for a shared cache (RFC 9111 §5.2.2.10).
///
/// An operator's grace (a rule's or a route's: `operator_grace`) overrides only what `s-maxage` implies,
/// as Varnish's does: Magento and most frameworks send `s-maxage` to set the shared cache's TTL, not to
/// forbid grace. The explicit directives always win; without an operator's grace the default stays
/// RFC-strict.
pub fn stale_forbidden_by(
    cc: &CacheControl,
    no_cache: bool,
    operator_grace: bool,
) -> Option<&'static str> {
    if no_cache {
        Some("no-cache")
    } else if cc.must_revalidate {
        Some("must-revalidate")
    } else if cc.proxy_revalidate {
        Some("proxy-revalidate")
    } else if cc.s_maxage.is_some() && !operator_grace {
        Some("s-maxage")
    } else {
        None
    }
}

/// Whether a response is stored; either way it is delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Store it, with these lifetimes and variant fields.
    Store(Storable),
    /// Deliver but do not store, with the reason (for logs and `Cache-Status`).
    DontStore(NotStored),
}

/// Why a response was delivered but not stored. Its [`token`](NotStored::token) is `Cache-Status`'s
/// `detail` (RFC 9211 §2.8) and the access log's: stable, so dashboards and scripts can count by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// A `backend_response` rule said `store = false`.
    Rule,
    /// A status never stored whole: 1xx, 206, 304.
    Status,
    /// A server error under a route's TTL, which is meant for the good answers.
    ServerError,
    /// `Cache-Control: no-store`.
    NoStore,
    /// `Cache-Control: private`.
    Private,
    /// The request had `Authorization` and the response is not marked shareable.
    Authorization,
    /// `Set-Cookie`, without `cache.cache_set_cookie`.
    SetCookie,
    /// `Vary: *`.
    VaryAny,
    /// No freshness given, and a status that may not be given one heuristically.
    NoFreshness,
    /// `no-cache` with neither `ETag` nor `Last-Modified` to revalidate with.
    NoCacheWithoutValidator,
    /// No freshness left (`max-age=0`, an `Expires` in the past, `default_ttl` 0).
    NotFresh,
    /// Larger than `cache.max_object_size`.
    TooLarge,
    /// A part of an object larger than `cache.max_sliced_object_size`.
    TooLargeSliced,
    /// A part that cannot be joined with the next: no strong validator, or a content coding.
    PartUnjoinable,
    /// An answer to a part's range that is neither the part nor the whole.
    PartAnswer,
    /// A 206 whose `Content-Range` does not place it: malformed, of no known length, or disagreeing with
    /// its `Content-Length`.
    PartUnplaced,
    /// A `POST`'s response without explicit freshness (RFC 9111 §3).
    PostWithoutFreshness,
    /// A server error while a stale object stands in for the failing origin.
    StandIn,
    /// It varies on a field a `backend_request` rule changed.
    VariesOnRewritten,
    /// The request was never looked up (passed), so nothing it gets is stored.
    NotLookedUp,
    /// Storable, but the store did not take it: a full or failing disk, a store shutting down, a write
    /// that failed (the store logs and counts which).
    StoreRefused,
}

impl NotStored {
    /// The `Cache-Status` `detail` token.
    pub fn token(self) -> &'static str {
        match self {
            Self::Rule => "rule-no-store",
            Self::Status => "uncacheable-status",
            Self::ServerError => "server-error",
            Self::NoStore => "no-store",
            Self::Private => "private",
            Self::Authorization => "authorization",
            Self::SetCookie => "set-cookie",
            Self::VaryAny => "vary-star",
            Self::NoFreshness => "no-freshness",
            Self::NoCacheWithoutValidator => "no-cache-without-validator",
            Self::NotFresh => "not-fresh",
            Self::TooLarge => "too-large",
            Self::TooLargeSliced => "too-large-sliced",
            Self::PartUnjoinable => "part-unjoinable",
            Self::PartAnswer => "part-answer",
            Self::PartUnplaced => "part-unplaced",
            Self::PostWithoutFreshness => "post-without-freshness",
            Self::StandIn => "server-error-stand-in",
            Self::VariesOnRewritten => "varies-on-rewritten",
            Self::NotLookedUp => "not-looked-up",
            Self::StoreRefused => "store-refused",
        }
    }
}

impl std::fmt::Display for NotStored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.token())
    }
}

/// Statuses whose caching requirements this cache knows, for `must-understand`: the registered final
/// ones it stores whole (not 206 or 304).
fn understood(status: StatusCode) -> bool {
    status.canonical_reason().is_some()
        && !matches!(
            status,
            StatusCode::PARTIAL_CONTENT | StatusCode::NOT_MODIFIED
        )
}

/// A failure of the origin: a server error but 501, which is a lasting answer about the method.
fn failure(status: StatusCode) -> bool {
    status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED
}

/// Whether a response may replace the stored variant it was fetched for. A server error may not while
/// that variant can still stand in for a failing origin (grace or stale-if-error): storing the error
/// would end the stale answers that are better than it.
pub fn replaces_stand_in(status: StatusCode) -> bool {
    !failure(status)
}

/// Whether the response gives its freshness itself (`max-age`, `s-maxage`, `Expires`, or the targeted
/// field's): what a cached POST's response needs (RFC 9110 §9.3.3, RFC 9111 §3).
pub fn explicitly_fresh(headers: &HeaderMap, policy: &Policy) -> bool {
    let cc = CacheControl::governing(headers, &policy.cache.targeted_cache_control);
    cc.max_age.is_some()
        || cc.s_maxage.is_some()
        || (!cc.targeted && headers.contains_key(header::EXPIRES))
}

fn has_validator(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED)
}

/// Whether a request carried `Authorization`, and if so whether the origin itself let its answer be
/// shared (RFC 9111 §3.5).
///
/// Sharing an authorized answer loosens caching, so it is decided on what the origin sent, read before
/// any `backend_response` rule edited the head: a rule that rewrites `Cache-Control` to `public` (as
/// Varnish recipes do for an API) must not turn Alice's `private` answer into everybody's. The store then
/// asks the edited head too ([`decide_adjusted`]), so both readings must agree to share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// No `Authorization`.
    None,
    /// `Authorization` was sent; `origin_shares`: the origin's own directives share the answer.
    Authorized {
        /// The origin's own head (before rules) marks the answer shareable.
        origin_shares: bool,
    },
}

impl Credentials {
    /// Whether the request was `authorized`, read with the response head `origin` as the origin sent it
    /// (before rules).
    pub fn of(authorized: bool, origin: &HeaderMap, policy: &Policy) -> Self {
        if !authorized {
            return Self::None;
        }
        let cc = CacheControl::governing(origin, &policy.cache.targeted_cache_control);
        Self::Authorized {
            origin_shares: shares_authorized(&cc, policy),
        }
    }
}

/// Whether directives let a shared cache store an answer to an authorized request. RFC 9111 §3.5 lets
/// `must-revalidate` share it too, but personal pages carry it (`max-age=0, must-revalidate`) more often
/// than they carry `private`: only an operator who looks up authorized requests (`cache_authorized`)
/// takes it as leave to share.
fn shares_authorized(cc: &CacheControl, policy: &Policy) -> bool {
    cc.public || cc.s_maxage.is_some() || (cc.must_revalidate && policy.cache.cache_authorized)
}

/// Decides on a response, as the origin sent it, to a request that was eligible for lookup.
/// `request_authorized` is whether the request carried `Authorization` (only reachable when the policy
/// caches such requests).
pub fn decide(
    request_authorized: bool,
    status: StatusCode,
    headers: &HeaderMap,
    policy: &Policy,
    response_time: SystemTime,
) -> Decision {
    decide_adjusted(
        Credentials::of(request_authorized, headers, policy),
        status,
        headers,
        policy,
        &Adjust::default(),
        response_time,
    )
}

/// What rules (`backend_response`) change in a decision; each setting defaults to changing nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adjust {
    /// Freshness whatever the headers say; unlike a route's `ttl`, also for a server error (the rule
    /// named its status). `no-store`, `private`, `Set-Cookie` and `Vary: *` still forbid storing.
    pub ttl: Option<Duration>,
    /// Freshness when the origin gives none, instead of `cache.default_ttl`.
    pub default_ttl: Option<Duration>,
    /// The least freshness of a storable response (not of a `no-cache` one, which is revalidated).
    pub ttl_min: Option<Duration>,
    /// The most freshness of a storable response.
    pub ttl_max: Option<Duration>,
    /// Grace, instead of the route's or the response's.
    pub grace: Option<Duration>,
    /// Time kept past grace, instead of `cache.keep`.
    pub keep: Option<Duration>,
    /// `false`: not stored, whatever the headers say.
    pub store: Option<bool>,
    /// `true`: compressed when stored whatever its size and type; `false`: never (Varnish's `do_gzip`).
    pub compress: Option<bool>,
    /// `true`: Edge Side Includes are processed in the response; `false`: not (Varnish's `do_esi`).
    pub esi: Option<bool>,
}

/// [`decide`], with what rules change applied: `headers` is the head as the rules left it, and
/// `credentials` was read from the one the origin sent ([`Credentials::of`]).
pub fn decide_adjusted(
    credentials: Credentials,
    status: StatusCode,
    headers: &HeaderMap,
    policy: &Policy,
    adjust: &Adjust,
    response_time: SystemTime,
) -> Decision {
    use Decision::DontStore;
    if adjust.store == Some(false) {
        return DontStore(NotStored::Rule);
    }
    if status.is_informational()
        || matches!(
            status,
            StatusCode::PARTIAL_CONTENT | StatusCode::NOT_MODIFIED
        )
    {
        return DontStore(NotStored::Status);
    }
    // A server error is stored only for the freshness its own headers give it (RFC 9111 §3), never for a
    // route's TTL, which is meant for the good answers.
    let server_error = failure(status);
    if server_error && policy.ttl_override.is_some() && adjust.ttl.is_none() {
        return DontStore(NotStored::ServerError);
    }
    let ttl_override = adjust.ttl.or(policy.ttl_override);
    let cc = CacheControl::governing(headers, &policy.cache.targeted_cache_control);
    // must-understand lets a cache that understands the status ignore no-store (RFC 9111 §5.2.2.3).
    if cc.no_store && !(cc.must_understand && understood(status)) {
        return DontStore(NotStored::NoStore);
    }
    if cc.private {
        return DontStore(NotStored::Private);
    }
    // Both the origin's head and the one rules left must share an authorized answer.
    if let Credentials::Authorized { origin_shares } = credentials {
        if !(origin_shares && shares_authorized(&cc, policy)) {
            return DontStore(NotStored::Authorization);
        }
    }
    if headers.contains_key(header::SET_COOKIE) && !policy.cache.cache_set_cookie {
        return DontStore(NotStored::SetCookie);
    }
    let mut vary = match vary::parse(headers) {
        Vary::Any => return DontStore(NotStored::VaryAny),
        Vary::None => Vec::new(),
        Vary::Headers(names) => names,
    };
    for name in &policy.key_headers {
        if !vary.contains(name) {
            vary.push(name.clone());
        }
    }
    let lifetime = match freshness::lifetime(status, headers, &cc, policy, response_time) {
        Lifetime::Default(ttl) => Lifetime::Default(adjust.default_ttl.unwrap_or(ttl)),
        lifetime => lifetime,
    };
    if let (Lifetime::Default(_), None) = (&lifetime, ttl_override) {
        if !freshness::heuristically_cacheable(status) {
            return DontStore(NotStored::NoFreshness);
        }
    }
    // A route's TTL replaces every freshness directive, `no-cache` included; only storing is still
    // forbidden by what forbids it.
    let no_cache = cc.no_cache && ttl_override.is_none();
    let operator_grace = adjust.grace.or(policy.grace_override).is_some();
    let no_stale = stale_forbidden_by(&cc, no_cache, operator_grace).is_some();
    let ttl = if no_cache {
        Duration::ZERO
    } else {
        let ttl = ttl_override.unwrap_or(lifetime.duration());
        let ttl = adjust.ttl_min.map_or(ttl, |min| ttl.max(min));
        adjust.ttl_max.map_or(ttl, |max| ttl.min(max))
    };
    if ttl.is_zero() && !(no_cache && has_validator(headers)) {
        return DontStore(if no_cache {
            NotStored::NoCacheWithoutValidator
        } else {
            NotStored::NotFresh
        });
    }
    let (grace, stale_if_error) = if no_stale {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (
            adjust.grace.or(policy.grace_override).unwrap_or(
                cc.stale_while_revalidate
                    .map_or(policy.cache.default_grace, Duration::from_secs),
            ),
            // A stored server error does not stand in for the next one: the origin's newer answer is
            // as good, and the stale error would hide that the origin has changed its mind.
            if server_error {
                Duration::ZERO
            } else {
                cc.stale_if_error
                    .map_or(policy.cache.error_grace, Duration::from_secs)
            },
        )
    };
    Decision::Store(Storable {
        ttl,
        grace,
        keep: adjust.keep.unwrap_or(policy.cache.keep),
        stale_if_error,
        no_stale,
        vary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as headers;
    use crate::Cache;
    use crate::Lines;

    #[test]
    fn explicit_freshness_is_what_the_response_says_itself() {
        let p = Policy::default();
        let cases: &[(Lines, bool)] = &[
            (&[("cache-control", "max-age=60")], true),
            (&[("cache-control", "s-maxage=60, private")], true),
            (&[("expires", "Thu, 01 Jan 2099 00:00:00 GMT")], true),
            (&[("last-modified", "Thu, 01 Jan 2015 00:00:00 GMT")], false),
            (&[("cache-control", "public")], false),
            (
                &[
                    ("cdn-cache-control", "no-store"),
                    ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
                ],
                false,
            ),
            (&[], false),
        ];
        for (h, want) in cases {
            assert_eq!(explicitly_fresh(&headers(h), &p), *want, "{h:?}");
        }
    }

    fn store(ttl: u64, grace: u64, no_stale: bool, vary: &[&str]) -> Decision {
        let stale_if_error = if no_stale {
            Duration::ZERO
        } else {
            Policy::default().cache.error_grace
        };
        Decision::Store(Storable {
            ttl: Duration::from_secs(ttl),
            grace: Duration::from_secs(grace),
            keep: Duration::ZERO,
            stale_if_error,
            no_stale,
            vary: vary.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn store_error(ttl: u64) -> Decision {
        Decision::Store(Storable {
            stale_if_error: Duration::ZERO,
            ..match store(ttl, 0, false, &[]) {
                Decision::Store(s) => s,
                Decision::DontStore(_) => unreachable!(),
            }
        })
    }

    #[test]
    fn a_server_error_never_replaces_what_stands_in_for_one() {
        for (status, replaces) in [
            (200, true),
            (404, true),
            (501, true),
            (500, false),
            (503, false),
            (599, false),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(replaces_stand_in(status), replaces, "{status}");
        }
    }

    /// Real responses and the `Cache-Status` detail their refusal gives: the tokens are an interface.
    #[test]
    fn refusals_carry_stable_tokens() {
        let policy = Policy::default();
        let cases: &[(bool, u16, Lines<'_>, &str)] = &[
            (
                false,
                200,
                &[("cache-control", "no-store, max-age=60")],
                "no-store",
            ),
            (
                false,
                200,
                &[("cache-control", "private, max-age=60")],
                "private",
            ),
            (
                true,
                200,
                &[("cache-control", "max-age=60")],
                "authorization",
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60"), ("set-cookie", "s=1")],
                "set-cookie",
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60"), ("vary", "*")],
                "vary-star",
            ),
            (false, 200, &[("cache-control", "max-age=0")], "not-fresh"),
            (false, 200, &[], "not-fresh"),
            (
                false,
                200,
                &[("cache-control", "no-cache")],
                "no-cache-without-validator",
            ),
            (false, 201, &[], "no-freshness"),
            (
                false,
                206,
                &[("cache-control", "max-age=60")],
                "uncacheable-status",
            ),
        ];
        for &(authorized, status, lines, token) in cases {
            let status = StatusCode::from_u16(status).unwrap();
            let got = decide(
                authorized,
                status,
                &headers(lines),
                &policy,
                SystemTime::now(),
            );
            match got {
                Decision::DontStore(why) => assert_eq!(why.token(), token, "{lines:?}"),
                Decision::Store(_) => panic!("{lines:?} stored"),
            }
        }
        let ruled = Adjust {
            store: Some(false),
            ..Adjust::default()
        };
        let got = decide_adjusted(
            Credentials::None,
            StatusCode::OK,
            &HeaderMap::new(),
            &policy,
            &ruled,
            SystemTime::now(),
        );
        assert_eq!(got, Decision::DontStore(NotStored::Rule));
        assert_eq!(NotStored::Rule.token(), "rule-no-store");
    }

    #[test]
    fn table() {
        let d = Decision::DontStore;
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let cases: &[(bool, u16, Lines<'_>, Decision)] = &[
            (
                false,
                200,
                &[("cache-control", "max-age=60")],
                store(60, 0, false, &[]),
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60, stale-while-revalidate=30")],
                store(60, 30, false, &[]),
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60, must-revalidate")],
                store(60, 0, true, &[]),
            ),
            (
                false,
                200,
                &[("cache-control", "s-maxage=60, proxy-revalidate")],
                store(60, 0, true, &[]),
            ),
            (
                false,
                200,
                &[(
                    "cache-control",
                    "max-age=600, s-maxage=60, stale-while-revalidate=30",
                )],
                store(60, 0, true, &[]),
            ),
            (
                false,
                200,
                &[("cache-control", "no-store, max-age=60")],
                d(NotStored::NoStore),
            ),
            (
                false,
                200,
                &[("cache-control", "no-store, must-understand, max-age=60")],
                store(60, 0, false, &[]),
            ),
            (
                false,
                200,
                &[("cache-control", "private, max-age=60")],
                d(NotStored::Private),
            ),
            (
                false,
                200,
                &[("cache-control", "no-cache"), ("etag", "\"v1\"")],
                store(0, 0, true, &[]),
            ),
            (
                false,
                200,
                &[("cache-control", "no-cache, max-age=60")],
                d(NotStored::NoCacheWithoutValidator),
            ),
            (false, 200, &[], d(NotStored::NotFresh)),
            (
                false,
                200,
                &[("cache-control", "max-age=0")],
                d(NotStored::NotFresh),
            ),
            (false, 200, &[("expires", "0")], d(NotStored::NotFresh)),
            (
                false,
                200,
                &[
                    ("date", date),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                store(360, 0, false, &[]),
            ),
            (
                false,
                302,
                &[
                    ("date", date),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                d(NotStored::NoFreshness),
            ),
            (
                false,
                302,
                &[("cache-control", "max-age=5")],
                store(5, 0, false, &[]),
            ),
            (
                false,
                206,
                &[("cache-control", "max-age=60")],
                d(NotStored::Status),
            ),
            (
                false,
                503,
                &[("cache-control", "max-age=60")],
                store_error(60),
            ),
            (
                false,
                500,
                &[("cache-control", "max-age=5")],
                store_error(5),
            ),
            (
                false,
                599,
                &[("cache-control", "max-age=5")],
                store_error(5),
            ),
            (
                false,
                502,
                &[("cache-control", "max-age=5, stale-if-error=60")],
                store_error(5),
            ),
            (
                false,
                503,
                &[
                    ("date", date),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                d(NotStored::NoFreshness),
            ),
            (false, 503, &[], d(NotStored::NoFreshness)),
            (
                false,
                599,
                &[
                    ("date", date),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                    ("cache-control", "public"),
                ],
                store_error(360),
            ),
            (
                false,
                599,
                &[("cache-control", "max-age=60, no-store, must-understand")],
                d(NotStored::NoStore),
            ),
            (
                false,
                299,
                &[("cache-control", "max-age=60, no-store, must-understand")],
                d(NotStored::NoStore),
            ),
            (
                false,
                404,
                &[("cache-control", "max-age=60, no-store, must-understand")],
                store(60, 0, false, &[]),
            ),
            (
                false,
                501,
                &[("cache-control", "max-age=60")],
                store(60, 0, false, &[]),
            ),
            (
                false,
                304,
                &[("cache-control", "max-age=60")],
                d(NotStored::Status),
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60"), ("set-cookie", "a=b")],
                d(NotStored::SetCookie),
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60"), ("vary", "*")],
                d(NotStored::VaryAny),
            ),
            (
                false,
                200,
                &[("cache-control", "max-age=60"), ("vary", "Accept-Encoding")],
                store(60, 0, false, &["accept-encoding"]),
            ),
            (
                true,
                200,
                &[("cache-control", "max-age=60")],
                d(NotStored::Authorization),
            ),
            (
                true,
                200,
                &[("cache-control", "max-age=60, public")],
                store(60, 0, false, &[]),
            ),
            (
                true,
                200,
                &[("cache-control", "s-maxage=60")],
                store(60, 0, true, &[]),
            ),
            (
                true,
                200,
                &[("cache-control", "max-age=60, must-revalidate")],
                d(NotStored::Authorization),
            ),
        ];
        for (auth, status, h, want) in cases {
            let got = decide(
                *auth,
                StatusCode::from_u16(*status).unwrap(),
                &headers(h),
                &Policy::default(),
                SystemTime::now(),
            );
            assert_eq!(&got, want, "{status} {h:?} authorized={auth}");
        }
        // An operator who looks up authorized requests takes must-revalidate as RFC 9111 §3.5 does.
        let looked_up = Policy::new(Cache {
            cache_authorized: true,
            ..Cache::default()
        });
        let revalidated = headers(&[("cache-control", "max-age=60, must-revalidate")]);
        let got = decide(
            true,
            StatusCode::OK,
            &revalidated,
            &looked_up,
            SystemTime::now(),
        );
        assert!(matches!(got, Decision::Store(_)), "{got:?}");
    }

    /// A rule that rewrites `Cache-Control` in `backend_response` may make an anonymous answer shared,
    /// never an authorized one the origin kept private: both the origin's head and the edited one must
    /// share it.
    #[test]
    fn an_authorized_answer_is_shared_only_when_the_origin_itself_shares_it() {
        let p = Policy::default();
        // (origin's own fields, the fields after rules, authorized, stored)
        let cases: &[(Lines, Lines, bool, bool)] = &[
            (
                &[("cache-control", "private, no-store")],
                &[("cache-control", "public, max-age=300")],
                true,
                false,
            ),
            (
                &[("cache-control", "max-age=60")],
                &[("cache-control", "public, max-age=300")],
                true,
                false,
            ),
            (&[], &[("cache-control", "s-maxage=300")], true, false),
            (
                &[("cache-control", "public, max-age=60")],
                &[("cache-control", "public, max-age=300")],
                true,
                true,
            ),
            // The origin shares, a rule takes it back: tightening acts on either head.
            (
                &[("cache-control", "public, max-age=60")],
                &[("cache-control", "max-age=60")],
                true,
                false,
            ),
            // Without credentials, the rule's head is what the store reads (recipe 11).
            (
                &[("cache-control", "private, no-store")],
                &[("cache-control", "public, max-age=300")],
                false,
                true,
            ),
        ];
        for &(origin, ruled, authorized, stored) in cases {
            let got = decide_adjusted(
                Credentials::of(authorized, &headers(origin), &p),
                StatusCode::OK,
                &headers(ruled),
                &p,
                &Adjust::default(),
                SystemTime::now(),
            );
            assert_eq!(
                matches!(got, Decision::Store(_)),
                stored,
                "{origin:?} -> {ruled:?} authorized={authorized}: {got:?}"
            );
        }
    }

    #[test]
    fn stale_if_error_comes_from_the_response_or_the_policy() {
        let h = headers(&[("cache-control", "max-age=5, stale-if-error=60")]);
        let Decision::Store(s) = decide(
            false,
            StatusCode::OK,
            &h,
            &Policy::default(),
            SystemTime::now(),
        ) else {
            panic!("stored")
        };
        assert_eq!(s.stale_if_error, Duration::from_secs(60));
        let h = headers(&[(
            "cache-control",
            "max-age=5, must-revalidate, stale-if-error=60",
        )]);
        let Decision::Store(s) = decide(
            false,
            StatusCode::OK,
            &h,
            &Policy::default(),
            SystemTime::now(),
        ) else {
            panic!("stored")
        };
        assert_eq!(s.stale_if_error, Duration::ZERO);
    }

    #[test]
    fn cdn_cache_control_governs_and_expires_is_then_ignored() {
        let h = headers(&[
            ("cache-control", "no-store"),
            ("expires", "0"),
            ("cdn-cache-control", "max-age=600"),
        ]);
        let got = decide(
            false,
            StatusCode::OK,
            &h,
            &Policy::default(),
            SystemTime::now(),
        );
        assert_eq!(got, store(600, 0, false, &[]));
        let off = Policy::new(Cache {
            targeted_cache_control: vec![],
            ..Cache::default()
        });
        assert_eq!(
            decide(false, StatusCode::OK, &h, &off, SystemTime::now()),
            Decision::DontStore(NotStored::NoStore)
        );
    }

    /// Magento sends `public, max-age=N, s-maxage=N`; a rule's grace must hold under it, as Varnish's
    /// does, and still yield to what the origin says explicitly.
    #[test]
    fn an_operators_grace_holds_under_s_maxage_and_yields_to_explicit_directives() {
        let three_days = Duration::from_secs(3 * 86_400);
        let ruled = Adjust {
            grace: Some(three_days),
            ..Adjust::default()
        };
        let cases: &[(&Adjust, &str, Decision, Option<&str>)] = &[
            (
                &ruled,
                "public, max-age=86400, s-maxage=86400",
                store(86_400, three_days.as_secs(), false, &[]),
                None,
            ),
            (
                &ruled,
                "public, s-maxage=60, must-revalidate",
                store(60, 0, true, &[]),
                Some("must-revalidate"),
            ),
            (
                &ruled,
                "s-maxage=60, proxy-revalidate",
                store(60, 0, true, &[]),
                Some("proxy-revalidate"),
            ),
            // No rule: the default stays RFC-strict.
            (
                &Adjust::default(),
                "public, max-age=86400, s-maxage=86400",
                store(86_400, 0, true, &[]),
                Some("s-maxage"),
            ),
            (
                &Adjust::default(),
                "public, max-age=60",
                store(60, 0, false, &[]),
                None,
            ),
        ];
        let policy = Policy::default();
        for (adjust, cc, want, forbidden_by) in cases {
            let h = headers(&[("cache-control", cc)]);
            let got = decide_adjusted(
                Credentials::None,
                StatusCode::OK,
                &h,
                &policy,
                adjust,
                SystemTime::now(),
            );
            assert_eq!(&got, want, "{cc}");
            let parsed = CacheControl::governing(&h, &policy.cache.targeted_cache_control);
            assert_eq!(
                stale_forbidden_by(&parsed, false, adjust.grace.is_some()),
                *forbidden_by,
                "{cc}"
            );
        }
        let h = headers(&[("cache-control", "no-cache"), ("etag", "\"v\"")]);
        let got = decide_adjusted(
            Credentials::None,
            StatusCode::OK,
            &h,
            &policy,
            &ruled,
            SystemTime::now(),
        );
        assert_eq!(got, store(0, 0, true, &[]), "no-cache voids a rule's grace");
    }

    #[test]
    fn keyed_request_fields_join_the_vary_names() {
        let policy = Policy {
            key_headers: vec!["x-forwarded-host".into(), "accept".into()],
            ..Policy::default()
        };
        let h = headers(&[("cache-control", "max-age=60"), ("vary", "Accept")]);
        let got = decide(false, StatusCode::OK, &h, &policy, SystemTime::now());
        assert_eq!(
            got,
            store(60, 0, false, &["accept", "x-forwarded-host"]),
            "the response's own names first, no repeats"
        );
    }

    #[test]
    fn configured_set_cookie_and_default_ttl() {
        let policy = Policy::new(Cache {
            cache_set_cookie: true,
            default_ttl: Duration::from_secs(30),
            ..Cache::default()
        });
        let got = decide(
            false,
            StatusCode::OK,
            &headers(&[("set-cookie", "a=b")]),
            &policy,
            SystemTime::now(),
        );
        assert_eq!(got, store(30, 0, false, &[]));
    }

    #[test]
    fn a_route_override_replaces_what_the_headers_say_but_not_what_forbids_storing() {
        let policy = Policy {
            ttl_override: Some(Duration::from_secs(3600)),
            grace_override: Some(Duration::from_secs(60)),
            ..Policy::default()
        };
        let cases: &[(u16, Lines<'_>, Decision)] = &[
            (
                200,
                &[("cache-control", "max-age=5")],
                store(3600, 60, false, &[]),
            ),
            (200, &[], store(3600, 60, false, &[])),
            (302, &[], store(3600, 60, false, &[])),
            (
                200,
                &[("cache-control", "max-age=5, stale-while-revalidate=9")],
                store(3600, 60, false, &[]),
            ),
            (
                200,
                &[("cache-control", "no-cache")],
                store(3600, 60, false, &[]),
            ),
            (
                200,
                &[("cache-control", "max-age=5, must-revalidate")],
                store(3600, 0, true, &[]),
            ),
            (
                200,
                &[("cache-control", "no-store")],
                Decision::DontStore(NotStored::NoStore),
            ),
            (
                200,
                &[("cache-control", "private")],
                Decision::DontStore(NotStored::Private),
            ),
            (
                200,
                &[("set-cookie", "a=b")],
                Decision::DontStore(NotStored::SetCookie),
            ),
            (503, &[], Decision::DontStore(NotStored::ServerError)),
        ];
        for (status, h, want) in cases {
            let status = StatusCode::from_u16(*status).unwrap();
            let got = decide(false, status, &headers(h), &policy, SystemTime::now());
            assert_eq!(&got, want, "{status} {h:?}");
        }
    }
}
