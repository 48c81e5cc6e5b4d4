//! PATCH (vendored): peers announcing frames longer than h3 will buffer, end to end over quinn.
//! h3 0.0.8 buffered every frame other than DATA whole before parsing it, whatever its announced
//! length; these frames are now refused or skipped from their header.

use std::{convert::TryFrom, time::Duration};

use assert_matches::assert_matches;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future;
use http::{Request, Response, StatusCode};

use crate::{
    client,
    error::{Code, ConnectionError, LocalError, StreamError},
    proto::{
        coding::Encode,
        frame::{Frame, FrameType, Settings},
        headers::Header,
        stream::StreamType,
        varint::VarInt,
    },
    qpack, server,
};

use super::h3_quinn;
use super::{init_tracing, Pair};

fn frame_header(buf: &mut BytesMut, ty: FrameType, len: u64) {
    ty.encode(buf);
    VarInt::from_u64(len).unwrap().encode(buf);
}

/// A request whose HEADERS frame announces more than max_field_section_size is answered 431 once
/// the frame's length has arrived, without waiting for its payload, and the connection carries on.
#[tokio::test]
async fn request_headers_over_limit_refused_from_length() {
    init_tracing();
    let mut pair = Pair::default();
    let mut server = pair.server();

    let client_fut = async {
        let connection = pair.client_inner().await;
        let (mut driver, mut send_request) =
            client::new(h3_quinn::Connection::new(connection.clone()))
                .await
                .unwrap();
        let drive = async move { future::poll_fn(|cx| driver.poll_close(cx)).await };
        let requests = async {
            let (mut req_send, mut req_recv) = connection.open_bi().await.unwrap();
            let mut buf = BytesMut::new();
            frame_header(&mut buf, FrameType::HEADERS, 1 << 40);
            buf.put_slice(&[0; 4096]);
            req_send.write_all(&buf).await.unwrap();
            // The rest of the frame never comes.

            let mut response = Bytes::from(req_recv.read_to_end(1 << 16).await.unwrap());
            let Ok(Frame::Headers(mut block)) = Frame::decode(&mut response) else {
                panic!("the answer is not a HEADERS frame");
            };
            let fields = qpack::decode_stateless(&mut block, u64::MAX)
                .unwrap()
                .fields;
            let (status, _) = Header::try_from(fields)
                .unwrap()
                .into_response_parts()
                .unwrap();
            assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

            // The next request on the connection is served.
            let mut stream = send_request
                .send_request(Request::get("http://localhost/salut").body(()).unwrap())
                .await
                .unwrap();
            stream.finish().await.unwrap();
            let response = stream.recv_response().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        };
        tokio::select! {
            biased;
            _ = requests => (),
            e = drive => panic!("client connection ended: {:?}", e),
        }
    };

    let server_fut = async {
        let conn = server.next().await;
        let mut incoming = server::builder()
            .max_field_section_size(1024)
            .build(conn)
            .await
            .unwrap();

        let resolver = incoming.accept().await.unwrap().unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), resolver.resolve_request())
            .await
            .expect("waited for the announced payload")
            .err()
            .expect("should return an error");
        assert_matches!(
            err,
            StreamError::HeaderTooBig { actual_size, max_size: 1024 } if actual_size == 1 << 40
        );

        let resolver = incoming.accept().await.unwrap().unwrap();
        let (_, mut stream) = resolver.resolve_request().await.unwrap();
        stream
            .send_response(Response::builder().status(200).body(()).unwrap())
            .await
            .unwrap();
        stream.finish().await.unwrap();

        // Until the client closes the connection.
        let _ = incoming.accept().await;
    };

    tokio::join!(server_fut, client_fut);
}

/// A reserved frame on the control stream is skipped as it arrives, however long, and the frames
/// after it are read as before.
#[tokio::test]
async fn control_stream_reserved_frame_skipped() {
    init_tracing();
    let mut pair = Pair::default();
    let mut server = pair.server();

    let client_fut = async {
        let connection = pair.client_inner().await;
        let mut control_stream = connection.open_uni().await.unwrap();

        let mut buf = BytesMut::new();
        StreamType::CONTROL.encode(&mut buf);
        Frame::Settings::<Bytes>(Settings::default()).encode(&mut buf);
        frame_header(&mut buf, FrameType::RESERVED, 8 << 20);
        control_stream.write_all(&buf[..]).await.unwrap();
        let zeros = vec![0; 64 * 1024];
        for _ in 0..128 {
            control_stream.write_all(&zeros).await.unwrap();
        }

        // A DATA frame after it: the server finds it, so it read past the reserved frame's end.
        let mut buf = BytesMut::new();
        Frame::Data(Bytes::from("")).encode(&mut buf);
        control_stream.write_all(&buf[..]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    };

    let server_fut = async {
        let conn = server.next().await;
        let mut incoming = server::Connection::new(conn).await.unwrap();
        assert_matches!(
            incoming.accept().await.map(|_| ()).unwrap_err(),
            ConnectionError::Local {
                error: LocalError::Application {
                    code: Code::H3_FRAME_UNEXPECTED,
                    ..
                }
            }
        );
    };

    tokio::select! { _ = server_fut => (), _ = client_fut => panic!("client resolved first") };
}

/// A SETTINGS frame announcing more than h3 buffers for it closes the connection with
/// H3_EXCESSIVE_LOAD as soon as its length has arrived.
#[tokio::test]
async fn control_stream_settings_over_limit() {
    init_tracing();
    let mut pair = Pair::default();
    let mut server = pair.server();

    let client_fut = async {
        let connection = pair.client_inner().await;
        let mut control_stream = connection.open_uni().await.unwrap();

        let mut buf = BytesMut::new();
        StreamType::CONTROL.encode(&mut buf);
        frame_header(&mut buf, FrameType::SETTINGS, 1 << 40);
        buf.put_slice(&[0; 100]);
        control_stream.write_all(&buf[..]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    };

    let server_fut = async {
        let conn = server.next().await;
        let mut incoming = server::Connection::new(conn).await.unwrap();
        assert_matches!(
            incoming.accept().await.map(|_| ()).unwrap_err(),
            ConnectionError::Local {
                error: LocalError::Application {
                    code: Code::H3_EXCESSIVE_LOAD,
                    ..
                }
            }
        );
    };

    tokio::select! { _ = server_fut => (), _ = client_fut => panic!("client resolved first") };
}
