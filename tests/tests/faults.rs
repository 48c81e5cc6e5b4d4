//! The store under a broken disk: full, damaged, read-only. lacquerd always starts, keeps serving what it
//! safely can, says what happened (log, health, stats), never serves a wrong body and never brings back a
//! purged or banned one.

use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};
use serde_json::{json, Value};

const HOST: &str = "www.example.test";

/// A restarted daemon listens on a new port, so requests name a fixed host (the cache key includes it).
async fn try_get(addr: SocketAddr, path: &str) -> Result<ClientReply, String> {
    request(addr, Method::GET, path, &[("host", HOST)], Bytes::new()).await
}

async fn get(addr: SocketAddr, path: &str) -> ClientReply {
    try_get(addr, path).await.expect("request")
}

/// A body unique to `path`: its length and every byte derive from the path.
fn body_for(path: &str) -> Bytes {
    let seed = path
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
    let len = if let Some(kib) = path.strip_prefix("/big/") {
        kib.split('/').next().unwrap().parse::<usize>().unwrap() * 1024
    } else {
        1000 + seed as usize % 5000
    };
    // xorshift: no window of the body repeats, so a piece of it can be found on disk by its content.
    let mut x = u64::from(seed) | 1 << 40;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8
        })
        .collect::<Vec<_>>()
        .into()
}

async fn origin() -> Origin {
    Origin::start(|s| Reply::ok(body_for(&s.path)).header("cache-control", "max-age=3600")).await
}

async fn health(d: &Daemon) -> Value {
    let r = d.admin_get("/v1/health", None).await;
    assert_eq!(r.status, 200);
    serde_json::from_slice(&r.body).expect("health JSON")
}

async fn wait_for_health(d: &Daemon, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = health(d).await;
        if h["status"] == status {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "health never became {status}: {h}\nlog:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn durable(d: &Daemon, n: u64) {
    d.wait_for_stats("durable objects", |s| {
        s["store"]["objects_durable"].as_u64() >= Some(n)
    })
    .await;
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Overwrites `len` bytes every `step` bytes of `file` with a pattern that is no valid encoding.
fn scribble(file: &Path, step: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    let size = f.metadata().unwrap().len();
    let junk: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(97) ^ 0x5a)
        .collect();
    let mut at = step / 3;
    while at < size {
        f.write_all_at(&junk[..junk.len().min((size - at) as usize)], at)
            .unwrap();
        at += step;
    }
    f.sync_all().unwrap();
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("skipped: mounting a tmpfs needs root (CI runs this test as root)");
            return None;
        }
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("mount runs");
        if !status.success() {
            eprintln!("skipped: cannot mount a tmpfs on {}", path.display());
            return None;
        }
        Some(Tmpfs(path.to_owned()))
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .expect("mount runs");
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes a file until the filesystem is full, leaving about `leave` bytes free.
fn fill_disk(file: &Path, leave: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(file).unwrap();
    let block = vec![0xa5u8; 64 * 1024];
    loop {
        let free = fs_free(file.parent().unwrap());
        if free <= leave + block.len() as u64 {
            break;
        }
        if f.write_all(&block).is_err() {
            break;
        }
    }
    let _ = f.sync_all();
}

fn fs_free(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut s), 0);
        s.f_bavail as u64 * s.f_frsize as u64
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_degrades_the_store_and_space_coming_back_restores_it() {
    let origin = origin().await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let Some(fs) = Tmpfs::mount(&dir.path().join("store"), "32m") else {
        return;
    };
    // The harness asks for a 256 MiB disk tier: more than the filesystem has.
    let mut d = Daemon::start_in(origin.addr, dir.clone(), &[]);
    for n in 0..6 {
        let path = format!("/big/512/a{n}");
        assert!(get(d.addr, &path).await.body == body_for(&path));
    }
    durable(&d, 6).await;
    assert_eq!(health(&d).await["status"], "ok");

    let filler = fs.0.join("filler");
    fill_disk(&filler, 256 * 1024);
    for n in 0..12 {
        let path = format!("/big/512/b{n}");
        for _ in 0..2 {
            let r = get(d.addr, &path).await;
            assert_eq!(r.status, 200);
            assert!(r.body == body_for(&path), "{path}: whole body while full");
        }
    }
    let h = wait_for_health(&d, "degraded").await;
    assert!(
        h.to_string().contains("disk"),
        "the reason names the disk: {h}"
    );
    let stats = d.stats().await;
    assert_eq!(stats["store"]["disk_full"], 1, "{stats}");
    assert!(
        stats["store"]["fills_refused"].as_u64().unwrap() > 0,
        "{stats}"
    );
    for n in 0..6 {
        let path = format!("/big/512/a{n}");
        let r = get(d.addr, &path).await;
        assert_eq!(
            r.x_cache(),
            "HIT",
            "{path} still served while the disk is full"
        );
        assert!(r.body == body_for(&path));
    }

    std::fs::remove_file(&filler).unwrap();
    wait_for_health(&d, "ok").await;
    let path = "/big/512/c0";
    get(d.addr, path).await;
    durable(&d, 7).await;
    let r = get(d.addr, path).await;
    assert_eq!(r.x_cache(), "HIT", "storing resumed once space came back");
    assert!(r.body == body_for(path));
    let log = d.log();
    assert_eq!(
        log.matches("store disk is full").count(),
        1,
        "the condition is logged once:\n{log}"
    );
    assert_eq!(log.matches("store disk has room again").count(), 1, "{log}");
    assert!(
        log.contains("storage.disk_size does not fit"),
        "an oversized disk_size is reported at start:\n{log}"
    );
    d.stop();
}

/// Ten objects of one to three chunks, durable, then a clean stop.
async fn stored_then_stopped(origin: &Origin) -> Daemon {
    let mut d = Daemon::start(origin.addr, &[]);
    for n in 0..10 {
        let path = format!("/big/{}/o{n}", 100 + n * 60);
        assert!(get(d.addr, &path).await.body == body_for(&path));
    }
    durable(&d, 10).await;
    d.stop();
    d
}

async fn all_served_whole(d: &Daemon) -> Vec<String> {
    let mut caches = Vec::new();
    for n in 0..10 {
        let path = format!("/big/{}/o{n}", 100 + n * 60);
        let r = try_get(d.addr, &path)
            .await
            .unwrap_or_else(|e| panic!("{path}: a broken response ({e})\nlog:\n{}", d.log()));
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body == body_for(&path), "{path}: wrong bytes");
        caches.push(r.x_cache().to_owned());
    }
    caches
}

#[tokio::test(flavor = "multi_thread")]
async fn scribbled_metadata_is_moved_aside_and_the_daemon_starts_empty() {
    let origin = origin().await;
    let d = stored_then_stopped(&origin).await;
    let meta = d.dir.path().join("store/meta");
    for file in files(&meta) {
        scribble(&file, 64, 16);
    }
    let mut d = d.restart();
    let caches = all_served_whole(&d).await;
    assert!(caches.iter().all(|c| c == "MISS"), "{caches:?}");
    let h = health(&d).await;
    assert_eq!(h["status"], "degraded", "{h}");
    assert!(h.to_string().contains("moved aside"), "{h}");
    let stats = d.stats().await;
    assert_eq!(stats["store"]["damaged_at_start"], 1, "{stats}");
    assert!(d.log().contains("ERROR"), "said loudly:\n{}", d.log());
    let aside: Vec<_> = std::fs::read_dir(d.dir.path().join("store"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged store is kept aside once");
    durable(&d, 10).await;
    d.stop();
    // The next start is clean, and what was stored since is there.
    let mut d = d.restart();
    assert_eq!(health(&d).await["status"], "ok");
    let caches = all_served_whole(&d).await;
    assert!(caches.iter().all(|c| c == "HIT"), "{caches:?}");
    d.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn truncated_metadata_never_stops_the_daemon() {
    let origin = origin().await;
    for keep in [0.0, 0.3, 0.6, 0.9] {
        let d = stored_then_stopped(&origin).await;
        for file in files(&d.dir.path().join("store/meta")) {
            let len = std::fs::metadata(&file).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.set_len((len as f64 * keep) as u64).unwrap();
        }
        let mut d = d.restart();
        all_served_whole(&d).await;
        d.stop();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scribbled_chunk_files_turn_into_misses_not_broken_responses() {
    let origin = origin().await;
    // Restarted, so the bodies are on disk only; then damaged under the running daemon (foyer checks what
    // it recovers at start, so damage from before a start never reaches a lookup).
    let d = stored_then_stopped(&origin).await.restart();
    // The second chunk (bytes 256 KiB to 512 KiB) of every body that has one, found by its content.
    let mut damaged = 0;
    for file in files(&d.dir.path().join("store/bodies")) {
        use std::os::unix::fs::{FileExt, MetadataExt};
        if std::fs::metadata(&file).unwrap().blocks() == 0 {
            continue;
        }
        let bytes = std::fs::read(&file).unwrap();
        for n in 0..10 {
            let body = body_for(&format!("/big/{}/o{n}", 100 + n * 60));
            if body.len() < 300_064 {
                continue;
            }
            let pattern: String = body[300_000..300_064]
                .iter()
                .map(|b| format!("\\x{b:02x}"))
                .collect();
            let found = regex::bytes::Regex::new(&format!("(?-u){pattern}"))
                .unwrap()
                .find(&bytes)
                .map(|m| m.start());
            if let Some(at) = found {
                let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
                f.write_all_at(&[0x5a; 64], at as u64).unwrap();
                damaged += 1;
            }
        }
    }
    assert!(damaged >= 5, "found the chunks to damage ({damaged})");
    let mut d = d;
    let caches = all_served_whole(&d).await;
    assert!(
        caches.iter().any(|c| c == "MISS"),
        "the damage hit something: {caches:?}"
    );
    // Damaged bodies were dropped and fetched again.
    durable(&d, 1).await;
    let caches = all_served_whole(&d).await;
    assert!(caches.iter().all(|c| c == "HIT"), "{caches:?}");
    d.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_store_directory_still_starts_and_serves() {
    let origin = origin().await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let Some(fs) = Tmpfs::mount(&dir.path().join("store"), "64m") else {
        return;
    };
    let mut d = Daemon::start_in(origin.addr, dir.clone(), &[]);
    for n in 0..3 {
        get(d.addr, &format!("/r{n}")).await;
    }
    durable(&d, 3).await;
    d.stop();
    fs.remount("ro");
    let mut d = d.restart();
    for n in 0..3 {
        let path = format!("/r{n}");
        for _ in 0..2 {
            let r = get(d.addr, &path).await;
            assert_eq!(r.status, 200);
            assert!(r.body == body_for(&path));
        }
    }
    let h = health(&d).await;
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(d.stats().await["store"]["memory_only"], 1);
    d.stop();
    fs.remount("rw");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_directory_that_cannot_hold_the_secret_still_starts() {
    let origin = origin().await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let Some(fs) = Tmpfs::mount(&dir.path().join("store"), "16m") else {
        return;
    };
    // Read-only from the first start: there is no secret yet, and none can be made where it belongs.
    fs.remount("ro");
    let mut d = Daemon::start_in(origin.addr, dir.clone(), &[]);
    let log = d.log();
    assert!(
        log.contains("cannot be kept in the store directory"),
        "says what happened: {log}"
    );
    let file = d.secret_file();
    assert!(!file.starts_with(dir.path()), "{}", file.display());
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    for _ in 0..2 {
        let r = get(d.addr, "/r0").await;
        assert_eq!(r.status, 200);
        assert!(r.body == body_for("/r0"));
    }
    // The secret of this run works: the admin API answers with it.
    assert_eq!(d.stats().await["store"]["memory_only"], 1);
    assert_eq!(health(&d).await["status"], "degraded");
    d.stop();
    std::fs::remove_file(&file).unwrap();
    fs.remount("rw");
}

fn file_lengths(dir: &Path) -> Vec<(PathBuf, u64)> {
    files(dir)
        .into_iter()
        .map(|f| {
            let len = std::fs::metadata(&f).unwrap().len();
            (f, len)
        })
        .collect()
}

/// The observed defect: purge 30, ban 1, stop, truncate sled's files, restart: purged and banned objects
/// were served again as hits. Truncating to the lengths before the purges rolls sled back exactly.
#[tokio::test(flavor = "multi_thread")]
async fn purged_and_banned_objects_never_come_back_after_metadata_truncation() {
    let origin = origin().await;
    for round in 0..3 {
        let mut d = Daemon::start(origin.addr, &[]);
        for n in 0..40 {
            get(d.addr, &format!("/o{n}")).await;
        }
        durable(&d, 40).await;
        // Let sled's periodic flush settle so the lengths describe the stored objects.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = file_lengths(&d.dir.path().join("store/meta"));
        for n in 0..30 {
            let r = d
                .admin_post("/v1/purge", json!({"url": format!("http://{HOST}/o{n}")}))
                .await;
            assert_eq!(r.status, 200);
        }
        let r = d
            .admin_post("/v1/bans", json!({"expression": "req.url ~ ^/o3[0-4]$"}))
            .await;
        assert!(r.status.is_success());
        if round == 2 {
            d.kill9();
        } else {
            d.stop();
        }
        for (file, len) in &before {
            let f = std::fs::OpenOptions::new().write(true).open(file);
            if let Ok(f) = f {
                let now = f.metadata().unwrap().len();
                let to = if round == 1 { *len / 2 } else { *len };
                f.set_len(to.min(now)).unwrap();
            }
        }
        let mut d = d.restart();
        let mut resurrected = Vec::new();
        for n in 0..40 {
            let path = format!("/o{n}");
            let r = get(d.addr, &path).await;
            assert!(r.body == body_for(&path));
            if n < 35 && r.x_cache() == "HIT" {
                resurrected.push(path);
            }
        }
        assert!(
            resurrected.is_empty(),
            "round {round}: invalidated objects served as hits: {resurrected:?}\nlog:\n{}",
            d.log()
        );
        d.stop();
    }
}

/// A small ext4 filesystem on a loop device, which can be shut down (every I/O then fails with EIO, as
/// on a dying disk); unmounted when dropped.
struct Ext4 {
    mount: PathBuf,
    image: PathBuf,
}

impl Ext4 {
    fn mount(path: &Path, image: &Path) -> Option<Ext4> {
        if !is_root() {
            eprintln!("skipped: a loop-mounted filesystem needs root (CI runs this test as root)");
            return None;
        }
        std::fs::create_dir_all(path).unwrap();
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        if !(ok(Command::new("truncate").args(["-s", "64M"]).arg(image))
            && ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image))
            && ok(Command::new("mount")
                .args(["-o", "loop"])
                .arg(image)
                .arg(path)))
        {
            eprintln!("skipped: cannot loop-mount an ext4 image here");
            return None;
        }
        Some(Ext4 {
            mount: path.to_owned(),
            image: image.to_owned(),
        })
    }

    /// `FS_IOC_SHUTDOWN` (`_IOR('X', 125, u32)`) without flushing the log: from now on every I/O fails.
    fn shut_down(&self) {
        let dir = std::fs::File::open(&self.mount).unwrap();
        let flags: u32 = 2;
        // SAFETY: the ioctl reads one u32 from the pointer, which outlives the call.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&dir),
                0x8004_587d,
                &flags as *const u32,
            )
        };
        assert_eq!(rc, 0, "shutdown ioctl");
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// The body tier on a disk that dies under the running daemon: foyer's writes fail with EIO and its
/// flusher dies. The daemon must say so and stop storing, not go on silently as a pass-through.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_store_task_is_reported_not_silent() {
    let origin = origin().await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let image = dir.path().join("bodies.img");
    let Some(bodies) = Ext4::mount(&dir.path().join("store/bodies"), &image) else {
        return;
    };
    let mut d = Daemon::start_in(origin.addr, dir.clone(), &[]);
    for n in 0..4 {
        get(d.addr, &format!("/big/300/a{n}")).await;
    }
    durable(&d, 4).await;
    bodies.shut_down();
    for n in 0..40 {
        let path = format!("/big/300/b{n}");
        let r = get(d.addr, &path).await;
        assert!(r.body == body_for(&path), "{path}: served whole");
        if health(&d).await["status"] == "degraded" {
            break;
        }
    }
    let h = wait_for_health(&d, "degraded").await;
    assert!(h.to_string().contains("died"), "{h}");
    let stats = d.stats().await;
    assert!(
        stats["store"]["tasks_failed"].as_u64() >= Some(1),
        "{stats}"
    );
    for n in 0..4 {
        let path = format!("/big/300/a{n}");
        let r = get(d.addr, &path).await;
        assert!(r.body == body_for(&path), "{path}: still served");
    }
    let path = "/big/300/c0";
    for _ in 0..2 {
        let r = get(d.addr, path).await;
        assert!(r.body == body_for(path));
    }
    let refused = d.stats().await["store"]["fills_refused"].as_u64().unwrap();
    assert!(
        refused >= 1,
        "fills are refused, not queued for a dead task"
    );
    d.wait_for_log("store task died").await;
    let status = d.terminate();
    assert!(
        status.success(),
        "shutdown after a dead task: {status}\n{}",
        d.log()
    );
}

/// Where the chunks of `path`'s stored body are: (chunks, in memory, on disk).
async fn tiers(d: &Daemon, path: &str) -> (u64, u64, u64) {
    let url = format!("/v1/objects?url={path}&host={HOST}");
    let r = d.admin_get(&url, Some(&d.secret())).await;
    let v: Value = serde_json::from_slice(&r.body).expect("inspect JSON");
    let t = &v["variants"][0]["tiers"];
    let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{v}"));
    (n("chunks"), n("in_memory"), n("on_disk"))
}

/// A body larger than a sixteenth of the memory tier (64 MiB in the harness), on the disk tier only after a
/// restart: read ahead while it is sent, it arrives whole and a range in its middle exactly, and past its
/// first MiB it streams from disk without entering the memory tier.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_body_on_disk_streams_whole_without_filling_the_memory_tier() {
    let origin = origin().await;
    let path = "/big/6000/disk";
    let body = body_for(path);
    let mut d = Daemon::start(origin.addr, &[]);
    assert!(get(d.addr, path).await.body == body);
    durable(&d, 1).await;
    d.stop();
    let mut d = d.restart();
    assert_eq!(tiers(&d, path).await, (24, 0, 24), "on disk only");

    let (first, last) = (2_500_000, 4_300_000);
    let r = request(
        d.addr,
        Method::GET,
        path,
        &[("host", HOST), ("range", &format!("bytes={first}-{last}"))],
        Bytes::new(),
    )
    .await
    .expect("a whole range");
    assert_eq!(r.status, 206);
    assert_eq!(r.x_cache(), "HIT");
    assert!(r.body == body[first..=last], "exactly the range's bytes");

    for _ in 0..2 {
        let r = get(d.addr, path).await;
        assert_eq!(r.x_cache(), "HIT");
        assert!(r.body == body, "every byte, in order");
    }
    assert_eq!(
        tiers(&d, path).await,
        (24, 4, 24),
        "only the first MiB entered the memory tier"
    );
    let stats = d.stats().await;
    assert!(
        stats["store"]["chunk_reads_disk"].as_u64().unwrap() >= 2 * 20,
        "{stats}"
    );
    assert_eq!(origin.count(path), 1);
    d.stop();
}

/// Overwrites `needle` (64 bytes of a stored body) wherever the stopped daemon's body files hold it;
/// returns how many places.
fn damage(d: &Daemon, needle: &[u8]) -> usize {
    use std::os::unix::fs::FileExt;
    let mut damaged = 0;
    for file in files(&d.dir.path().join("store/bodies")) {
        let bytes = std::fs::read(&file).unwrap();
        if let Some(found) = bytes.windows(needle.len()).position(|w| w == needle) {
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.write_all_at(&vec![0x5a; needle.len()], found as u64)
                .unwrap();
            damaged += 1;
        }
    }
    damaged
}

/// Damages the 64 bytes of `body` at `at` in the stopped daemon's body files and restarts it: the request
/// that reads them breaks mid-body (never a whole wrong body), and the next is a miss served whole (the
/// origin's second fetch of `path`). Returns the restarted daemon.
async fn damaged_and_missed(
    d: &Daemon,
    origin: &Origin,
    path: &str,
    body: &Bytes,
    at: usize,
) -> Daemon {
    assert_eq!(
        damage(d, &body[at..at + 64]),
        1,
        "found the chunk to damage"
    );
    let d = d.restart();
    match try_get(d.addr, path).await {
        Err(e) => assert!(e.contains("body"), "broken mid-body: {e}"),
        Ok(r) => panic!("a damaged body served as whole: {} bytes", r.body.len()),
    }
    let r = get(d.addr, path).await;
    assert_eq!(r.x_cache(), "MISS");
    assert!(r.body == *body);
    assert_eq!(origin.count(path), 2);
    d
}

/// A chunk of a disk-tier body damaged past the first MiB (which is checked before the status line) is
/// found only while the body streams: the response then ends in an error after the right bytes, never with
/// wrong ones, and the next request is a miss served whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_chunk_damaged_mid_body_breaks_the_response_and_is_never_served() {
    let origin = origin().await;
    let path = "/big/6000/damaged";
    let body = body_for(path);
    let mut d = Daemon::start(origin.addr, &[]);
    assert!(get(d.addr, path).await.body == body);
    durable(&d, 1).await;
    d.stop();
    // Chunk 12 (bytes 3 MiB to 3.25 MiB), found by its content.
    let mut d = damaged_and_missed(&d, &origin, path, &body, 3 * 1024 * 1024 + 100_000).await;
    d.stop();
}

/// A body announced large (12 MiB) is stored in 1 MiB chunks where the tiers hold them (a 1 GiB disk tier):
/// read back whole from the disk tier after a restart; a chunk of it damaged on disk breaks the response
/// in progress, never served, and the next request is a miss served whole; a purge removes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_in_large_chunks_is_read_checked_and_purged_as_any_body() {
    let origin = origin().await;
    let path = "/big/12288/large-chunks";
    let body = body_for(path);
    let mut d = Daemon::start(origin.addr, &["--disk-size", "1GiB"]);
    assert!(get(d.addr, path).await.body == body);
    durable(&d, 1).await;
    assert_eq!(tiers(&d, path).await.0, 12, "12 chunks of 1 MiB");
    d.stop();
    let mut d = d.restart();
    let r = get(d.addr, path).await;
    assert_eq!(r.x_cache(), "HIT");
    assert!(r.body == body, "every byte, in order, from the disk tier");
    d.stop();
    // Chunk 6 (bytes 6 MiB to 7 MiB), found by its content.
    let mut d = damaged_and_missed(&d, &origin, path, &body, 6 * 1024 * 1024 + 300_000).await;
    let purged = d
        .admin_post("/v1/purge", json!({"url": format!("http://{HOST}{path}")}))
        .await;
    assert_eq!(
        purged.status,
        200,
        "{}",
        String::from_utf8_lossy(&purged.body)
    );
    let r = get(d.addr, path).await;
    assert_eq!(r.x_cache(), "MISS");
    assert!(r.body == body);
    assert_eq!(origin.count(path), 3);
    d.stop();
}
