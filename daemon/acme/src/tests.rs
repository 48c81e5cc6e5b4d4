use std::os::unix::fs::PermissionsExt;

use lacquer_config::{Acme as Configured, AcmeChallenge};

use super::*;

fn configured(domains: &[&str]) -> Configured {
    Configured {
        domains: domains.iter().map(|d| d.to_string()).collect(),
        contact: Vec::new(),
        directory: Configured::LETSENCRYPT.to_owned(),
        challenge: AcmeChallenge::Http01,
        directory_ca: None,
    }
}

fn built(list: &[Configured]) -> Result<Acme, (usize, SettingError)> {
    Acme::new(
        PathBuf::from("/var/lib/lacquer/acme"),
        list.iter().enumerate(),
    )
}

#[test]
fn settings_are_checked_and_the_key_at_fault_named() {
    let with = |f: fn(&mut Configured)| {
        let mut c = configured(&["shop.example"]);
        f(&mut c);
        c
    };
    let cases: [(Configured, Option<&str>); 11] = [
        (configured(&["shop.example", "WWW.Shop.Example"]), None),
        (configured(&[]), Some("domains")),
        (configured(&["*.shop.example"]), Some("domains")),
        (configured(&["192.0.2.1"]), Some("domains")),
        (configured(&["shop example"]), Some("domains")),
        (
            configured(&["shop.example", "SHOP.example"]),
            Some("domains"),
        ),
        (
            with(|c| c.contact = vec!["mailto:ops@shop.example".into()]),
            None,
        ),
        (
            with(|c| c.contact = vec!["ops@shop.example".into()]),
            Some("contact"),
        ),
        (
            with(|c| c.directory = "http://acme.example/directory".into()),
            Some("directory"),
        ),
        (
            with(|c| c.directory = "not a url".into()),
            Some("directory"),
        ),
        (
            with(|c| c.directory_ca = Some("/nonexistent/ca.pem".into())),
            Some("directory_ca"),
        ),
    ];
    for (c, want) in cases {
        let got = built(std::slice::from_ref(&c))
            .err()
            .map(|(_, e)| e.setting());
        assert_eq!(got, want, "{c:?}");
    }
}

#[test]
fn listeners_with_the_same_settings_share_a_certificate_and_a_first_domain_names_one_file() {
    let a = configured(&["shop.example", "www.shop.example"]);
    let acme = built(&[a.clone(), a.clone()]).unwrap();
    let (first, second) = (acme.for_listener(0).unwrap(), acme.for_listener(1).unwrap());
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(acme.views()[0].listeners, ["listen[0]", "listen[1]"]);
    assert_eq!(
        acme.views()[0].file,
        format!(
            "/var/lib/lacquer/acme/shop.example-{}.pem",
            directory_id(Configured::LETSENCRYPT)
        )
    );
    assert!(acme.for_listener(2).is_none());
    // One name in two certificates: their TLS-ALPN-01 challenges would meet.
    let other = configured(&["api.example", "www.shop.example"]);
    let (n, e) = built(&[a, other]).unwrap_err();
    assert_eq!((n, e.setting()), (1, "domains"));
    assert!(
        e.to_string().starts_with("names \"www.shop.example\""),
        "{e}"
    );
}

#[test]
fn http_01_answers_only_waiting_tokens_to_get_and_head() {
    let challenges = Challenges::default();
    let get = http::Method::GET;
    assert_eq!(
        challenges.http_01(&get, "/.well-known/acme-challenge/abc"),
        None
    );
    {
        let mut answering = order::Answering::new(&challenges);
        answering.http("abc".into(), "abc.thumb".into());
        let cases = [
            (
                http::Method::GET,
                "/.well-known/acme-challenge/abc",
                Some("abc.thumb"),
            ),
            (
                http::Method::HEAD,
                "/.well-known/acme-challenge/abc",
                Some("abc.thumb"),
            ),
            (http::Method::POST, "/.well-known/acme-challenge/abc", None),
            (http::Method::GET, "/.well-known/acme-challenge/abd", None),
            (http::Method::GET, "/.well-known/acme-challenge/abc/", None),
            (http::Method::GET, "/x/.well-known/acme-challenge/abc", None),
            (http::Method::GET, "/.well-known/acme-challenge/", None),
        ];
        for (method, path, want) in cases {
            assert_eq!(
                challenges.http_01(&method, path).as_deref(),
                want,
                "{method} {path}"
            );
        }
    }
    // The order ended: withdrawn.
    assert_eq!(
        challenges.http_01(&get, "/.well-known/acme-challenge/abc"),
        None
    );
    assert_eq!(challenges.waiting.load(Relaxed), 0);
}

fn held(not_before: SystemTime, life: Duration) -> Held {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["shop.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    let mut held = Held::from_pem(pem.as_bytes(), &["shop.example".to_owned()]).unwrap();
    held.not_before = not_before;
    held.not_after = not_before + life;
    held
}

#[test]
fn renewal_is_due_two_thirds_through_and_health_warns_past_five_sixths_or_14_days() {
    const DAY: Duration = Duration::from_secs(86400);
    let acme = built(&[configured(&["shop.example"])]).unwrap();
    let m = acme.for_listener(0).unwrap();
    let now = SystemTime::now();
    // (issued this long ago, life) → warns
    let cases = [
        (DAY, 90 * DAY, false),
        (75 * DAY, 90 * DAY, false),
        (77 * DAY, 90 * DAY, true),
        (4 * DAY, 6 * DAY, false),
        (5 * DAY + DAY / 2, 6 * DAY, true),
    ];
    for (age, life, warns) in cases {
        let h = held(now - age, life);
        assert_eq!(h.renew_at(), h.not_before + life * 2 / 3);
        m.held.store(Some(Arc::new(h)));
        assert_eq!(m.problem(now).is_some(), warns, "{age:?} of {life:?}");
    }
    // None held: a problem once an order failed, not while the first runs.
    m.held.store(None);
    assert_eq!(m.problem(now), None);
    m.progress.lock().unwrap().last_error = Some("connection refused".into());
    assert_eq!(
        m.problem(now).as_deref(),
        Some(
            "acme: no certificate for shop.example yet; the last order failed: connection refused"
        )
    );
    // Backing off after failures from the last one: 5 minutes, doubling, at most 6 hours; kept across a
    // restart, so the next start waits too.
    let after = |failures| {
        m.next_due(failures, Some(now))
            .duration_since(now)
            .unwrap()
            .as_secs()
            / 60
    };
    assert_eq!([after(1), after(2), after(3), after(8)], [5, 10, 20, 360]);
    assert!(
        m.next_due(0, Some(now)) <= SystemTime::now(),
        "none held: at once"
    );
    // A certificate whose renewal is already due (issued with a short life, or a clock set forward) is
    // not ordered again and again: 5 minutes at least between orders.
    let short = held(now - 3 * DAY, 4 * DAY);
    m.held.store(Some(Arc::new(short)));
    assert_eq!(m.next_due(0, Some(now)), now + Duration::from_secs(300));
    assert_eq!(m.next_due(0, None), now - 3 * DAY + 4 * DAY * 2 / 3);
    // Expired: not presented (a listener's `tls` files are, if any).
    let expired = held(now - 5 * DAY, 4 * DAY);
    m.held.store(Some(Arc::new(expired)));
    assert!(m.current().is_none());
}

#[test]
fn a_kept_file_is_replaced_whole_and_readable_by_its_user_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("acme").join("shop.example.pem");
    assert!(stored::read(&file).unwrap().is_none());
    stored::write(&file, b"one").unwrap();
    stored::write(&file, b"two").unwrap();
    assert_eq!(stored::read(&file).unwrap().unwrap(), b"two");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    assert_eq!(
        std::fs::read_dir(file.parent().unwrap()).unwrap().count(),
        1
    );
}

#[test]
fn a_kept_certificate_for_other_names_or_with_another_key_is_refused() {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["shop.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let names = ["shop.example".to_owned(), "www.shop.example".to_owned()];
    let good = format!("{}{}", cert.pem(), key.serialize_pem());
    assert!(Held::from_pem(good.as_bytes(), &names[..1]).is_ok());
    let e = Held::from_pem(good.as_bytes(), &names).err().unwrap();
    assert_eq!(e, "is not for www.shop.example");
    let mismatched = format!("{}{}", cert.pem(), other.serialize_pem());
    let e = Held::from_pem(mismatched.as_bytes(), &names[..1])
        .err()
        .unwrap();
    assert!(e.starts_with("the key does not fit"), "{e}");
    let e = Held::from_pem(b"garbage", &names[..1]).err().unwrap();
    assert_eq!(e, "holds no certificate");
}
