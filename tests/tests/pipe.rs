//! `pipe = true`: WebSocket upgrades tunnelled through the real daemon to a real WebSocket origin, bytes
//! both ways; without the rule, upgrades are not performed.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::{SinkExt, StreamExt};
use http::HeaderMap;
use lacquer_tests::{Daemon, Origin, Reply};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::{
    accept_hdr_async, client_async,
    tungstenite::{
        handshake::server::{Request, Response},
        Error, Message,
    },
    MaybeTlsStream, WebSocketStream,
};

const PIPE_WEBSOCKETS: &str =
    "[[rule]]\nmatch = { headers = { upgrade = \"(?i)websocket\" } }\npipe = true\n";

/// How the WebSocket origin treats each connection after the handshake.
#[derive(Clone, Copy)]
enum Script {
    /// Greets, then answers every text message with `echo: ` and the message.
    Echo,
    /// Greets, then drops the connection without a closing handshake.
    Hangs,
}

/// A WebSocket origin that records the head of every handshake it completed.
struct WsOrigin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
}

impl WsOrigin {
    async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    // tungstenite's callback returns its error response by value.
                    #[allow(clippy::result_large_err)]
                    let record = |req: &Request, resp: Response| {
                        recorded.lock().unwrap().push(req.headers().clone());
                        Ok(resp)
                    };
                    let Ok(mut ws) = accept_hdr_async(stream, record).await else {
                        return;
                    };
                    ws.send(Message::text("hello from the origin"))
                        .await
                        .unwrap();
                    if let Script::Hangs = script {
                        return;
                    }
                    while let Some(Ok(msg)) = ws.next().await {
                        if let Message::Text(text) = msg {
                            let echo = format!("echo: {}", text.as_str());
                            if ws.send(Message::text(echo)).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { addr, seen }
    }

    fn seen(&self) -> Vec<HeaderMap> {
        self.seen.lock().unwrap().clone()
    }
}

fn daemon(backend: SocketAddr, rules: &str) -> Daemon {
    Daemon::with_config(
        backend,
        &format!("[[listen]]\naddress = \"127.0.0.1:0\"\n{rules}"),
    )
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The WebSocket handshake with `addr`, as a browser would send it for `ws://chat.example/chat`.
async fn connect(addr: SocketAddr) -> Result<Ws, Error> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let handshake = client_async("ws://chat.example/chat", MaybeTlsStream::Plain(tcp));
    let (ws, resp) = tokio::time::timeout(Duration::from_secs(10), handshake)
        .await
        .expect("handshake answered")?;
    assert_eq!(resp.status(), 101);
    Ok(ws)
}

async fn next_text(ws: &mut Ws) -> String {
    let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a message within 10 s")
        .expect("the tunnel is open")
        .expect("a message");
    msg.into_text().expect("a text message").as_str().to_owned()
}

#[tokio::test]
async fn a_websocket_is_tunnelled_both_ways() {
    let origin = WsOrigin::start(Script::Echo).await;
    let d = daemon(origin.addr, PIPE_WEBSOCKETS);
    let mut ws = connect(d.addr).await.expect("the upgrade goes through");
    assert_eq!(next_text(&mut ws).await, "hello from the origin");
    for n in 0..3 {
        ws.send(Message::text(format!("message {n}")))
            .await
            .unwrap();
        assert_eq!(next_text(&mut ws).await, format!("echo: message {n}"));
    }
    let large = "x".repeat(256 * 1024);
    ws.send(Message::text(large.clone())).await.unwrap();
    assert_eq!(next_text(&mut ws).await, format!("echo: {large}"));

    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    let h = &seen[0];
    assert!(
        h["upgrade"]
            .to_str()
            .unwrap()
            .eq_ignore_ascii_case("websocket"),
        "{h:?}"
    );
    assert!(
        h["connection"]
            .to_str()
            .unwrap()
            .eq_ignore_ascii_case("upgrade"),
        "{h:?}"
    );
    assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{h:?}");
    assert_eq!(h["via"], "1.1 lacquer", "{h:?}");
    assert_eq!(h["host"], "chat.example", "{h:?}");
    assert!(h.contains_key("sec-websocket-key"), "{h:?}");

    let stats = d.stats().await;
    let proxy = &stats["proxy"];
    assert_eq!(proxy["pipes"], 1, "{proxy}");
    assert_eq!(proxy["pipes_active"], 1, "{proxy}");
    let to_backend = proxy["pipe_bytes_to_backend"].as_u64().unwrap();
    let to_client = proxy["pipe_bytes_to_client"].as_u64().unwrap();
    assert!(to_backend > 256 * 1024, "{proxy}");
    assert!(
        to_client > 256 * 1024 + "hello from the origin".len() as u64,
        "{proxy}"
    );

    // The closing handshake goes through the tunnel too; the origin then closes, and so does the client.
    ws.close(None).await.unwrap();
    let closing = async { while let Some(Ok(_)) = ws.next().await {} };
    tokio::time::timeout(Duration::from_secs(10), closing)
        .await
        .expect("the origin closes after the closing handshake");
    drop(ws);
    d.wait_for_stats("the tunnel to close", |s| s["proxy"]["pipes_active"] == 0)
        .await;
}

#[tokio::test]
async fn a_tunnel_whose_origin_closes_ends_for_the_client() {
    let origin = WsOrigin::start(Script::Hangs).await;
    let d = daemon(origin.addr, PIPE_WEBSOCKETS);
    let mut ws = connect(d.addr).await.expect("the upgrade goes through");
    assert_eq!(next_text(&mut ws).await, "hello from the origin");
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the client's side ends with the origin's");
    assert!(
        matches!(end, None | Some(Err(_))),
        "no message after the origin went: {end:?}"
    );
    // The tunnel carries half a connection as long as the client keeps its own half open.
    drop(ws);
    d.wait_for_stats("the tunnel to close", |s| s["proxy"]["pipes_active"] == 0)
        .await;
}

#[tokio::test]
async fn without_a_pipe_rule_upgrades_are_not_performed() {
    let origin = Origin::start(|_| Reply::ok("plain")).await;
    let d = daemon(origin.addr, "");
    let refused = connect(d.addr).await.expect_err("no upgrade");
    let Error::Http(resp) = refused else {
        panic!("not an HTTP answer: {refused:?}");
    };
    assert_eq!(resp.status(), 200, "served as an ordinary request");
    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    for hop in ["upgrade", "connection"] {
        assert!(!seen[0].headers.contains_key(hop), "{:?}", seen[0].headers);
    }
    assert_eq!(d.stats().await["proxy"]["pipes"], 0);
}

#[tokio::test]
async fn an_upgrade_the_origin_refuses_is_answered_as_a_pass() {
    let origin = Origin::start(|_| Reply::ok("no WebSockets here").status(403)).await;
    let d = daemon(origin.addr, PIPE_WEBSOCKETS);
    let refused = connect(d.addr).await.expect_err("no upgrade");
    let Error::Http(resp) = refused else {
        panic!("not an HTTP answer: {refused:?}");
    };
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.headers()["x-cache"], "PASS");
    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].headers["upgrade"]
            .to_str()
            .unwrap()
            .eq_ignore_ascii_case("websocket"),
        "asked for the upgrade: {:?}",
        seen[0].headers
    );
    let proxy = &d.stats().await["proxy"];
    assert_eq!(proxy["pipes"], 0, "{proxy}");
    assert_eq!(proxy["passes"], 1, "{proxy}");
}

#[tokio::test]
async fn an_h2c_backend_gets_its_upgrades_over_http1() {
    // An upgrade is an HTTP/1.1 mechanism: a backend spoken to in HTTP/2 gets it on an HTTP/1.1
    // connection of its own to the same address (this origin speaks nothing else).
    let origin = WsOrigin::start(Script::Echo).await;
    let d = daemon(
        origin.addr,
        &format!(
            "[[backend]]\naddress = \"http://{}\"\nprotocol = \"h2c\"\n{PIPE_WEBSOCKETS}",
            origin.addr
        ),
    );
    let mut ws = connect(d.addr).await.expect("the upgrade goes through");
    assert_eq!(next_text(&mut ws).await, "hello from the origin");
    ws.send(Message::text("over http/1.1")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "echo: over http/1.1");
    assert_eq!(origin.seen().len(), 1);
}
