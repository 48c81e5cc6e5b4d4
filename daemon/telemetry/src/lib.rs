//! OpenTelemetry traces for lacquerd (`[telemetry]`): a server span per request, with `lookup`, `fetch` and
//! `store` children, exported in batches over OTLP/HTTP (protobuf); the fetch's context goes to the origin
//! as W3C `traceparent` and `tracestate`.
//!
//! Off (no `endpoint`), [`Telemetry::begin`] is one branch and a request carries nothing. On, a request that
//! is not sampled carries nothing either: the data path asks for a [`Trace`] in the request's extensions,
//! and finds one only on requests whose spans are exported.

#![warn(missing_docs)]

use std::{
    borrow::Cow,
    net::IpAddr,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Version};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry::{
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer, TracerProvider},
    Context, KeyValue, Value,
};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    propagation::TraceContextPropagator,
    runtime,
    trace::{
        span_processor_with_async_runtime::BatchSpanProcessor, BatchConfigBuilder, Sampler,
        SdkTracer, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
    },
    Resource,
};

use lacquer_config as config;

/// Why tracing could not start: the exporter could not be built from `telemetry.endpoint`.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.endpoint: {0}")]
pub struct TelemetryError(#[from] opentelemetry_otlp::ExporterBuildError);

/// Counts spans lost: dropped while `max_queue` are waiting for export, or in an export that failed.
pub type Dropped = Box<dyn Fn(u64) + Send + Sync>;

/// The tracer of the process, or nothing when `[telemetry]` has no `endpoint`.
#[derive(Debug, Default)]
pub struct Telemetry {
    on: Option<On>,
}

#[derive(Debug)]
struct On {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    export_timeout: Duration,
    /// `trust_client_trace`: the clients whose `traceparent` is followed.
    trusted: Vec<ipnet::IpNet>,
}

impl Telemetry {
    /// Tracing off: every request pays one branch.
    pub fn off() -> Self {
        Self::default()
    }

    /// Starts the exporter of `settings`, or nothing when it has no `endpoint`. Runs within a Tokio
    /// runtime: the batches are exported by a task of the runtime it is called in, never by the workers.
    pub fn start(settings: &config::Telemetry, dropped: Dropped) -> Result<Self, TelemetryError> {
        let Some(endpoint) = &settings.endpoint else {
            return Ok(Self::off());
        };
        let mut tcp = HttpConnector::new();
        // The endpoint's scheme decides whether TLS is spoken, as for backends.
        tcp.enforce_http(false);
        let tls = if endpoint.starts_with("https:") {
            let (loaded, roots_missing) = lacquer_backends::tls::client_config(Default::default())
                .map_err(|e| {
                    opentelemetry_otlp::ExporterBuildError::InternalFailure(e.to_string())
                })?;
            if let Some(why) = roots_missing {
                tracing::warn!("telemetry.endpoint: {why}");
            }
            loaded.config
        } else {
            // Never used (http:// makes no handshake): the system's roots are not worth reading for it.
            lacquer_backends::tls::trusting_nothing()
        };
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = HyperClient::new(connector, settings.export_timeout, None);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(settings.export_timeout)
            .build()?;
        let waiting = Arc::new(Waiting {
            spans: AtomicUsize::new(0),
            max: settings.max_queue,
            dropped,
        });
        let exporter = Counted {
            inner: exporter,
            waiting: waiting.clone(),
        };
        let batches = BatchSpanProcessor::builder(exporter, runtime::Tokio)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(settings.max_queue)
                    .with_max_export_timeout(settings.export_timeout)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded {
                inner: batches,
                waiting,
            })
            // A caller's sampling decision stands (ParentBased); a request without one is traced by ratio.
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        Ok(Self {
            on: Some(On {
                tracer: provider.tracer("lacquerd"),
                provider,
                export_timeout: settings.export_timeout,
                trusted: settings.trust_client_trace.clone(),
            }),
        })
    }

    /// Exports the spans still queued, for at most the export timeout (at shutdown). Call it outside the
    /// runtime [`Telemetry::start`] ran in, while that runtime still runs: the export is its task.
    pub fn shutdown(&self) {
        if let Some(on) = &self.on {
            if let Err(e) = on.provider.shutdown_with_timeout(on.export_timeout) {
                tracing::warn!(error = %e, "telemetry: spans not exported at shutdown");
            }
        }
    }

    /// Starts the server span of a request that arrived from `client`, as the child of the `traceparent` it
    /// carries, if any: the span, and the [`Trace`] its child spans start from. `None` when the span is not
    /// sampled: nothing is recorded.
    pub fn begin<B>(&self, req: &Request<B>, client: IpAddr) -> Option<(RequestSpan, Trace)> {
        let on = self.on.as_ref()?;
        // An untrusted client's `traceparent` would choose both the sampling (forcing every request
        // traced at any `sample_ratio`) and the trace id: ignored, the span is a root of our own.
        let caller = if on.trusted.iter().any(|net| net.contains(&client)) {
            TraceContextPropagator::new().extract(&Fields(req.headers()))
        } else {
            Context::new()
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", req.method().as_str().to_owned()),
            KeyValue::new("url.path", req.uri().path().to_owned()),
            KeyValue::new("network.protocol.version", protocol(req.version())),
            KeyValue::new("client.address", client.to_string()),
        ];
        if let Some(host) = host(req) {
            attributes.push(KeyValue::new("server.address", host));
        }
        let span = on
            .tracer
            .span_builder(name(req.method()))
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&on.tracer, &caller);
        if !span.span_context().is_sampled() {
            return None;
        }
        let cx = caller.with_span(span);
        let trace = Trace {
            tracer: on.tracer.clone(),
            cx: cx.clone(),
        };
        Some((RequestSpan { cx }, trace))
    }
}

/// The `Host` without its port: the name the client asked for.
fn host<B>(req: &Request<B>) -> Option<String> {
    let authority = match req.headers().get(header::HOST) {
        Some(v) => v.to_str().ok()?.parse::<http::uri::Authority>().ok()?,
        None => req.uri().authority()?.clone(),
    };
    Some(authority.host().to_owned())
}

/// The span's name: the method, as the HTTP semantic conventions name a server span without a route; an
/// extension method is `HTTP`, so that a client cannot make names without end.
fn name(method: &Method) -> Cow<'static, str> {
    let known = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
        Method::PATCH,
        Method::TRACE,
        Method::CONNECT,
    ];
    if known.contains(method) {
        Cow::Owned(method.as_str().to_owned())
    } else {
        Cow::Borrowed("HTTP")
    }
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// A request's server span; it ends when this is dropped (with the response body, for the time it took to
/// send).
pub struct RequestSpan {
    cx: Context,
}

impl RequestSpan {
    /// Records the response: its status, and the cache's verdict (`X-Cache`, lowercased) and whether the
    /// request waited for a fetch another request had started (`collapsed`), whose `fetch` span is that
    /// request's.
    pub fn respond(&self, status: StatusCode, cache: Option<&str>, collapsed: bool) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
        if let Some(cache) = cache {
            span.set_attribute(KeyValue::new("lacquer.cache", cache.to_ascii_lowercase()));
        }
        if collapsed {
            span.set_attribute(KeyValue::new("lacquer.collapsed", true));
        }
        // A server span is an error for the server's failures only (HTTP semantic conventions).
        if status.is_server_error() {
            span.set_attribute(KeyValue::new("error.type", status.as_str().to_owned()));
            span.set_status(Status::error(""));
        }
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// What a sampled request carries through the data path: the context its child spans start from.
#[derive(Clone)]
pub struct Trace {
    tracer: SdkTracer,
    cx: Context,
}

impl Trace {
    /// A `lookup` span: the store read for the request.
    pub fn lookup(&self) -> Child {
        self.child("lookup", SpanKind::Internal, Vec::new())
    }

    /// A `store` span: the response written into the store.
    pub fn store(&self) -> Child {
        self.child("store", SpanKind::Internal, Vec::new())
    }

    /// A `fetch` span: the request to the origin `backend` (named so in the configuration) at `address`
    /// (`host:port`). [`Child::inject`] sends its context with the origin request.
    pub fn fetch(&self, method: &Method, backend: &str, address: &str) -> Child {
        let (host, port) = match address.parse::<http::uri::Authority>() {
            Ok(a) => (a.host().to_owned(), a.port_u16()),
            Err(_) => (address.to_owned(), None),
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.as_str().to_owned()),
            KeyValue::new("lacquer.backend", backend.to_owned()),
            KeyValue::new("server.address", host),
        ];
        if let Some(port) = port {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        self.child("fetch", SpanKind::Client, attributes)
    }

    fn child(&self, name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> Child {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx);
        Child {
            cx: self.cx.with_span(span),
        }
    }
}

/// A child span of a request's; it ends when this is dropped.
pub struct Child {
    cx: Context,
}

impl Child {
    /// Sets an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        self.cx.span().set_attribute(KeyValue::new(key, value));
    }

    /// Records an origin's answer (`http.response.status_code`).
    pub fn status(&self, status: StatusCode) {
        self.set("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            self.fail(status.as_str());
        }
    }

    /// Marks the span as failed, for `why` (`error.type`: short, of few values).
    pub fn fail(&self, why: &str) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("error.type", why.to_owned()));
        span.set_status(Status::error(""));
    }

    /// Writes this span's context into an outgoing request's `traceparent` and `tracestate`, replacing those
    /// it had (the caller's, whose trace this span continues).
    pub fn inject(&self, headers: &mut HeaderMap) {
        headers.remove("traceparent");
        headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(&self.cx, &mut FieldsMut(headers));
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

struct Fields<'a>(&'a HeaderMap);

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct FieldsMut<'a>(&'a mut HeaderMap);

impl Injector for FieldsMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Spans finished and not yet exported (queued, or in an export under way), held to `max`: the batch
/// processor counts the spans its full queue drops but does not say how many.
struct Waiting {
    spans: AtomicUsize,
    max: usize,
    dropped: Dropped,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("spans", &self.spans)
            .field("max", &self.max)
            .finish()
    }
}

/// The batch processor, behind a count of the spans waiting: past `max`, a span is dropped (counted)
/// before it reaches the queue, so the queue never fills up.
#[derive(Debug)]
struct Bounded<P> {
    inner: P,
    waiting: Arc<Waiting>,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.waiting.spans.fetch_add(1, Relaxed) >= self.waiting.max {
            self.waiting.spans.fetch_sub(1, Relaxed);
            (self.waiting.dropped)(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, telling [`Waiting`] when a batch is done with, and counting a failed one's spans as
/// dropped.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    waiting: Arc<Waiting>,
}

/// Releases a batch's place when its export ends, or is given up at the export timeout (dropped).
struct Release {
    waiting: Arc<Waiting>,
    spans: usize,
    exported: bool,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.waiting.spans.fetch_sub(self.spans, Relaxed);
        if !self.exported {
            (self.waiting.dropped)(self.spans as u64);
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut release = Release {
            waiting: self.waiting.clone(),
            spans: batch.len(),
            exported: false,
        };
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            tracing::debug!(error = %e, "telemetry: an export to the collector failed");
        }
        release.exported = result.is_ok();
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_a_request_carries_nothing() {
        let req = Request::new(());
        assert!(Telemetry::off()
            .begin(&req, IpAddr::from([127, 0, 0, 1]))
            .is_none());
    }

    #[test]
    fn a_client_cannot_name_spans_at_will() {
        assert_eq!(name(&Method::GET), "GET");
        assert_eq!(name(&Method::from_bytes(b"BREW").unwrap()), "HTTP");
    }

    #[test]
    fn the_server_address_is_the_host_asked_for() {
        let mut req = Request::builder()
            .uri("http://origin.test:8080/a")
            .body(())
            .unwrap();
        assert_eq!(host(&req).as_deref(), Some("origin.test"));
        req.headers_mut().insert(
            header::HOST,
            HeaderValue::from_static("www.example.com:6081"),
        );
        assert_eq!(host(&req).as_deref(), Some("www.example.com"));
    }
}
