//! Routing: which backend or director a request goes to, and the cache policy its route gives it.

use std::sync::Arc;

use http::request::Parts;
use regex::Regex;

use lacquer_config::{Config, ConfigError, Cookies, ForwardingHeaders, RoutePrefetch};
use lacquer_policy::{
    encoding::Negotiation,
    headers::FORWARDING,
    host::{request_host, HostPattern},
    Policy,
};

use crate::{protection::ClientRateLimit, BackendError, BackendSet, BackendState, Director};

/// The most a route's `prefetch.playlist` may ask for.
pub const MAX_PREFETCH_PLAYLIST: usize = 16;

/// The most slices one object of a sliced route may be stored in (`cache.max_sliced_object_size` over
/// the route's `slice`): 8192, the 64 GiB default in slices of 8 MiB.
pub const MAX_PARTS: u64 = 8192;

/// Where a route sends requests. A route keeps its director, so a request started before a reload finishes
/// with the director it started with.
#[derive(Debug, Clone)]
pub enum Target {
    /// One backend, by its index in the route's backend set.
    Backend(usize),
    /// A director, which picks among its healthy members.
    Director(Arc<Director>),
}

/// One compiled route; the policy is `[cache]` with the route's overrides applied.
#[derive(Debug)]
pub struct Route {
    host: HostPattern,
    path_prefix: Option<String>,
    path_regex: Option<Regex>,
    /// Where the route's requests go.
    pub target: Target,
    /// `[cache]` with the route's `ttl`, `grace`, `cookies` and keyed forwarding fields applied.
    pub policy: Policy,
    /// `pass = true`: never looked up or stored.
    pub pass: bool,
    /// The backends `target` counts in, as of the configuration the route came from.
    backends: BackendSet,
    /// `cookies = "strip"`: `Cookie` removed from the request and `Set-Cookie` from the response.
    pub strip_cookies: bool,
    /// Token buckets per client; a reload starts them afresh.
    pub rate_limit: Option<ClientRateLimit>,
    /// Forwarding fields are removed from requests (`strip`); otherwise `policy.key_headers` names them.
    pub strip_forwarding: bool,
    /// `slice`: objects are fetched and stored in slices of this many bytes.
    pub slice: Option<u64>,
    /// `prefetch`: what is fetched before players ask for it. Default: nothing.
    pub prefetch: RoutePrefetch,
    /// `esi`: Edge Side Includes processed in every response (unless a rule says otherwise).
    pub esi: bool,
}

impl Route {
    /// The backend for a request with cache key `key`; unavailable when it (or every member of the
    /// director) is sick.
    pub fn pick(&self, key: &str) -> Result<&Arc<BackendState>, BackendError> {
        self.pick_from(None, key)
    }

    /// [`Route::pick`] among `chosen` (a rule's `backend`, made by [`Router::target`] from the same
    /// configuration) instead of the route's own target, when given.
    pub fn pick_from(
        &self,
        chosen: Option<&Target>,
        key: &str,
    ) -> Result<&Arc<BackendState>, BackendError> {
        let target = chosen.unwrap_or(&self.target);
        let healthy = |b: usize| self.backends[b].is_healthy();
        let picked = match target {
            Target::Backend(b) => healthy(*b).then_some(*b),
            Target::Director(d) => d.pick(key, healthy),
        };
        picked
            .map(|b| &self.backends[b])
            .ok_or_else(|| BackendError::Unavailable {
                name: self.target_name(target).to_owned(),
                reason: "sick",
            })
    }

    /// Whether `chosen` (else the route's target) has a healthy backend to send to.
    pub fn is_healthy(&self, chosen: Option<&Target>) -> bool {
        match chosen.unwrap_or(&self.target) {
            Target::Backend(b) => self.backends[*b].is_healthy(),
            Target::Director(d) => d.any_healthy(|b| self.backends[b].is_healthy()),
        }
    }

    /// The name of what `target` is.
    pub fn target_name<'a>(&'a self, target: &'a Target) -> &'a str {
        match target {
            Target::Backend(b) => self.backends[*b].name(),
            Target::Director(d) => &d.name,
        }
    }

    fn matches(&self, host: &str, path: &str) -> bool {
        self.host.matches(host)
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
            && self.path_regex.as_ref().is_none_or(|r| r.is_match(path))
    }
}

/// A configuration's routes and directors, compiled over its backends: what a reload replaces whole.
#[derive(Debug)]
pub struct Router {
    /// The `[[backend]]`s in order (the first takes what no route claims); states a reload found
    /// unchanged are carried over, health and all.
    pub backends: BackendSet,
    routes: Vec<Arc<Route>>,
    /// For requests no route matches: the first backend, `[cache]` as is.
    fallback: Arc<Route>,
    /// Every backend and director by name, for rules that choose one.
    named: Vec<(String, Target)>,
}

impl Router {
    /// The routes and directors of `config`, over `backends` (made from its `[[backend]]`s, in order);
    /// the error names the setting that cannot be built.
    pub fn new(config: &Config, backends: &BackendSet) -> Result<Self, ConfigError> {
        config.compression.check("compression")?;
        config.esi.check("esi")?;
        let backend_index = |name: &str| backends.iter().position(|b| b.name() == name);
        let names = config
            .backend
            .iter()
            .map(|b| &b.name)
            .chain(config.director.iter().map(|d| &d.name));
        for (i, name) in names.clone().enumerate() {
            if names.clone().take(i).any(|earlier| earlier == name) {
                return Err(ConfigError::setting(
                    "backend",
                    format!("the name {name:?} is used twice"),
                ));
            }
        }
        if let Some(n) = config.director.iter().position(|d| d.backends.is_empty()) {
            return Err(ConfigError::setting(
                format!("director[{n}]"),
                "a director needs at least one backend",
            ));
        }
        let directors = config
            .director
            .iter()
            .enumerate()
            .map(|(n, d)| {
                let members = d
                    .backends
                    .iter()
                    .map(|m| {
                        backend_index(m).ok_or_else(|| {
                            ConfigError::setting(
                                format!("director[{n}].backends"),
                                format!("no backend is named {m:?}"),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?;
                let names: Vec<&str> = d.backends.iter().map(String::as_str).collect();
                Ok(Arc::new(Director::new(&d.name, d.policy, members, &names)))
            })
            .collect::<Result<Vec<Arc<Director>>, ConfigError>>()?;
        let target = |n: usize, name: &str| {
            backend_index(name)
                .map(Target::Backend)
                .or_else(|| {
                    directors
                        .iter()
                        .find(|d| d.name == name)
                        .map(|d| Target::Director(d.clone()))
                })
                .ok_or_else(|| {
                    ConfigError::setting(
                        format!("route[{n}].backend"),
                        format!("no backend or director is named {name:?}"),
                    )
                })
        };
        let forwarding = |mode: ForwardingHeaders, policy: &mut Policy| {
            if mode == ForwardingHeaders::Key {
                policy.key_headers = FORWARDING.iter().map(|n| n.as_str().to_owned()).collect();
            }
            mode == ForwardingHeaders::Strip
        };
        let compression = |route: Option<bool>| {
            route
                .unwrap_or(config.compression.enabled)
                .then(|| Negotiation::new(config.compression.clone()))
        };
        let mut base = Policy::new(config.cache.clone());
        base.compression = compression(None);
        let strip_forwarding = forwarding(config.server.forwarding_headers, &mut base);
        let routes = config
            .route
            .iter()
            .enumerate()
            .map(|(n, r)| {
                let setting = |field: &str| format!("route[{n}].{field}");
                let mut policy = Policy::new(config.cache.clone());
                let mode = r
                    .forwarding_headers
                    .unwrap_or(config.server.forwarding_headers);
                let strip_forwarding = forwarding(mode, &mut policy);
                policy.ttl_override = r.ttl;
                policy.grace_override = r.grace;
                policy.compression = compression(r.compression);
                let slice = r.slice.map(|size| size.as_u64());
                if let Some(size) = slice {
                    let chunk = config.storage.chunk_size.as_u64().max(1);
                    if size == 0 || size % chunk != 0 {
                        return Err(ConfigError::setting(
                            setting("slice"),
                            format!(
                                "{} is not a multiple of storage.chunk_size ({})",
                                r.slice.expect("set"),
                                config.storage.chunk_size
                            ),
                        ));
                    }
                    if size > config.cache.max_object_size.as_u64() {
                        return Err(ConfigError::setting(
                            setting("slice"),
                            format!(
                                "a slice is stored as one object: {} is more than cache.max_object_size ({})",
                                r.slice.expect("set"),
                                config.cache.max_object_size
                            ),
                        ));
                    }
                    // An object's record lists its parts and is written whole as each arrives: their
                    // number is what one object's record costs.
                    let parts = config.cache.max_sliced_object_size.as_u64().div_ceil(size);
                    if parts > MAX_PARTS {
                        return Err(ConfigError::setting(
                            setting("slice"),
                            format!(
                                "cache.max_sliced_object_size ({}) would be {parts} slices of {}: at most \
                                 {MAX_PARTS}; make the slices larger or the objects smaller",
                                config.cache.max_sliced_object_size,
                                r.slice.expect("set")
                            ),
                        ));
                    }
                    // Slices are byte ranges of the origin's own representation.
                    policy.compression = None;
                }
                let prefetch = r.prefetch.unwrap_or_default();
                if prefetch.playlist > MAX_PREFETCH_PLAYLIST {
                    return Err(ConfigError::setting(
                        setting("prefetch.playlist"),
                        format!(
                            "{} is more than {MAX_PREFETCH_PLAYLIST}: players ask for what is near, and \
                             every prefetch costs the origin",
                            prefetch.playlist
                        ),
                    ));
                }
                match r.cookies {
                    Some(Cookies::Cache) => policy.cache.cache_cookie_requests = true,
                    Some(Cookies::Pass) => policy.cache.cache_cookie_requests = false,
                    Some(Cookies::Strip) | None => {}
                }
                Ok(Arc::new(Route {
                    host: HostPattern::parse(r.host.as_deref().unwrap_or(""))
                        .map_err(|e| ConfigError::setting(setting("host"), e))?,
                    path_prefix: r.path_prefix.clone(),
                    path_regex: r
                        .path_regex
                        .as_deref()
                        .map(Regex::new)
                        .transpose()
                        .map_err(|e| {
                            ConfigError::setting(
                                setting("path_regex"),
                                e.to_string().replace('\n', " "),
                            )
                        })?,
                    target: match r.backend.as_deref() {
                        Some(name) => target(n, name)?,
                        None => Target::Backend(0),
                    },
                    policy,
                    pass: r.pass,
                    backends: backends.clone(),
                    strip_cookies: r.cookies == Some(Cookies::Strip),
                    rate_limit: r
                        .rate_limit
                        .as_ref()
                        .map(ClientRateLimit::new)
                        .transpose()
                        .map_err(|e| ConfigError::setting(setting("rate_limit"), e))?,
                    strip_forwarding,
                    slice,
                    prefetch,
                    esi: r.esi,
                }))
            })
            .collect::<Result<_, ConfigError>>()?;
        let fallback = Arc::new(Route {
            host: HostPattern::Any,
            path_prefix: None,
            path_regex: None,
            target: Target::Backend(0),
            policy: base,
            pass: false,
            backends: backends.clone(),
            strip_cookies: false,
            rate_limit: None,
            strip_forwarding,
            slice: None,
            prefetch: RoutePrefetch::default(),
            esi: false,
        });
        let named = names
            .map(|name| Ok((name.clone(), target(0, name)?)))
            .collect::<Result<_, ConfigError>>()?;
        Ok(Self {
            backends: backends.clone(),
            routes,
            fallback,
            named,
        })
    }

    /// How the configuration names `route`: `route[N]`, or `default` for the one no route matches.
    pub fn describe(&self, route: &Arc<Route>) -> String {
        self.routes
            .iter()
            .position(|r| Arc::ptr_eq(r, route))
            .map_or_else(|| "default".to_owned(), |n| format!("route[{n}]"))
    }

    /// The backend or director named `name`, for a rule that sends requests there.
    pub fn target(&self, name: &str) -> Option<&Target> {
        self.named.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Forgets rate-limit buckets that are full again (run now and then).
    pub fn forget_idle_clients(&self) {
        for limit in self.routes.iter().filter_map(|r| r.rate_limit.as_ref()) {
            limit.forget_idle();
        }
    }

    /// Whether the request's path as sent and `lenient`, its reading by a lenient origin
    /// ([`lacquer_policy::normalize::lenient`]), choose the same route. When they do not, [`route`]
    /// chose by one reading alone, which may tighten caching (a pass) but must not loosen it: an origin
    /// that reads `/static/..;/account/me` as `/account/me` would have its account page stored under a
    /// `/static/` route's cookie-ignoring TTL.
    ///
    /// [`route`]: Router::route
    pub fn readings_agree(&self, parts: &Parts, lenient: &str) -> bool {
        if self.routes.is_empty() {
            return true;
        }
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let host = request_host(&parts.headers);
        let first = |p: &str| self.routes.iter().position(|r| r.matches(&host, p));
        first(path) == first(lenient)
    }

    /// The first route matching the request's host and path, else the fallback.
    pub fn route(&self, parts: &Parts) -> &Arc<Route> {
        if self.routes.is_empty() {
            return &self.fallback;
        }
        let host = request_host(&parts.headers);
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        // A route (a pass for `/account/`, another backend for `/admin/`) must not be escaped by a spelling
        // only the origin resolves: the first route either reading matches wins.
        let lenient = lacquer_policy::normalize::lenient(path);
        self.routes
            .iter()
            .find(|r| {
                r.matches(&host, path) || lenient.as_deref().is_some_and(|l| r.matches(&host, l))
            })
            .unwrap_or(&self.fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    fn config(text: &str) -> Config {
        Config::parse(text, "t").unwrap()
    }

    fn request(host: &str, path: &str) -> Parts {
        http::Request::get(path)
            .header(header::HOST, host)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn the_first_matching_route_applies_with_its_overrides() {
        let c = config(
            r#"
            [[backend]]
            name = "app"
            address = "127.0.0.1:1"
            [[backend]]
            name = "static"
            address = "127.0.0.1:2"
            [[backend]]
            name = "static2"
            address = "127.0.0.1:3"
            [[director]]
            name = "assets"
            policy = "hash"
            backends = ["static", "static2"]
            [[route]]
            host = "*.cdn.test"
            backend = "assets"
            ttl = "1h"
            cookies = "strip"
            [[route]]
            path_prefix = "/api/"
            pass = true
            [[route]]
            host = "shop.test"
            path_regex = "\\.(png|jpg)$"
            backend = "static"
            grace = "5m"
            cookies = "cache"
            compression = false
            [cache]
            default_ttl = "10s"
            "#,
        );
        let backends = crate::backend_set(&c).unwrap();
        let router = Router::new(&c, &backends).unwrap();
        let cases = [
            ("img.cdn.test", "/a.css", "assets", false, true),
            ("IMG.CDN.TEST:443", "/api/x", "assets", false, true),
            ("shop.test", "/api/cart", "app", true, false),
            ("shop.test:8080", "/p/1.png?v=2", "app", false, false),
            ("shop.test", "/p/1.png", "static", false, false),
            ("cdn.test", "/a.css", "app", false, false),
        ];
        for (host, path, target, pass, strip) in cases {
            let r = router.route(&request(host, path));
            let got = (r.target_name(&r.target), r.pass, r.strip_cookies);
            assert_eq!(got, (target, pass, strip), "{host}{path}");
        }
        let cdn = router.route(&request("a.cdn.test", "/"));
        assert_eq!(
            cdn.policy.ttl_override,
            Some(std::time::Duration::from_secs(3600))
        );
        assert_eq!(
            cdn.policy.cache.default_ttl,
            std::time::Duration::from_secs(10)
        );
        let png = router.route(&request("shop.test", "/x.png"));
        assert_eq!(
            png.policy.grace_override,
            Some(std::time::Duration::from_secs(300))
        );
        assert!(png.policy.cache.cache_cookie_requests);
        assert_eq!(png.policy.compression, None);
        assert_eq!(
            cdn.policy.compression,
            Some(Negotiation::new(c.compression.clone()))
        );
        let fallback = router.route(&request("other.test", "/"));
        let base = Policy {
            compression: Some(Negotiation::new(c.compression.clone())),
            ..Policy::new(c.cache.clone())
        };
        assert_eq!(fallback.policy, base);
        let picked = cdn.pick("a.cdn.test/x").unwrap();
        assert!(["static", "static2"].contains(&picked.name()));
        assert_eq!(fallback.pick("other.test/").unwrap().name(), "app");
    }

    /// Building the routes is their validation: each mistake is an error naming the setting.
    #[test]
    fn settings_that_cannot_be_built_are_named() {
        let base = "[[backend]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n\
                    [[backend]]\nname = \"b\"\naddress = \"127.0.0.1:2\"\n";
        let cases = [
            (
                "[[route]]\nhost = \"x.*\"\n",
                "route[0].host: \"x.*\" is not a host name",
            ),
            (
                "[[route]]\npath_regex = \"(\"\n",
                "route[0].path_regex: regex parse error",
            ),
            (
                "[[route]]\npath_prefix = \"/\"\n[[route]]\nbackend = \"nope\"\n",
                "route[1].backend: no backend or director is named \"nope\"",
            ),
            (
                "[[director]]\nname = \"d\"\npolicy = \"random\"\nbackends = [\"a\", \"z\"]\n",
                "director[0].backends: no backend is named \"z\"",
            ),
            (
                "[[route]]\nrate_limit = { requests = 0, per = \"1s\" }\n",
                "route[0].rate_limit: ",
            ),
            (
                "[[route]]\nslice = \"300KiB\"\n",
                "route[0].slice: 300.0 KiB is not a multiple of storage.chunk_size",
            ),
            (
                "[[route]]\nslice = \"512MiB\"\n",
                "route[0].slice: a slice is stored as one object",
            ),
            (
                "[[route]]\nslice = \"1MiB\"\n",
                "route[0].slice: cache.max_sliced_object_size (64.0 GiB) would be 65536 slices",
            ),
            (
                "[[director]]\nname = \"d\"\npolicy = \"random\"\nbackends = []\n",
                "director[0]: a director needs at least one backend",
            ),
            (
                "[[director]]\nname = \"a\"\npolicy = \"random\"\nbackends = [\"b\"]\n",
                "backend: the name \"a\" is used twice",
            ),
        ];
        for (extra, want) in cases {
            let c = config(&format!("{base}{extra}"));
            let backends = crate::backend_set(&c).unwrap();
            let got = Router::new(&c, &backends).unwrap_err().to_string();
            assert!(got.starts_with(want), "{extra}: {got}");
        }
        let backend_cases = [
            ("[backend]\naddress = \"https://o.test\"\ntls_ca = \"/nonexistent.pem\"\n".to_owned(),
                "backend.tls_ca: cannot read /nonexistent.pem"),
            ("[backend]\naddress = \"http://o.test\"\ntls_ca = \"/nonexistent.pem\"\n".to_owned(),
                "backend.tls_ca: only for https:// backends"),
            ("[backend]\naddress = \"ftp://o.test\"\n".to_owned(), "backend.address: \"ftp://o.test\": only http://"),
            (format!("{base}[[backend]]\nname = \"c\"\naddress = \"127.0.0.1:3\"\n[backend.probe]\nwindow = 4\nthreshold = 5\n"),
                "backend[2].probe: window must be 1 to 64"),
            (format!("{base}[[backend]]\nname = \"c\"\naddress = \"127.0.0.1:3\"\n[backend.probe]\nurl = \"health\"\n"),
                "backend[2].probe.url: \"health\" is not a path"),
        ];
        for (text, want) in backend_cases {
            let got = crate::backend_set(&config(&text)).unwrap_err().to_string();
            assert!(got.starts_with(want), "{text}: {got}");
        }
        let mut none = config(base);
        none.backend.clear();
        let got = crate::backend_set(&none).unwrap_err().to_string();
        assert!(got.starts_with("backend: no backend given"), "{got}");
    }
}
