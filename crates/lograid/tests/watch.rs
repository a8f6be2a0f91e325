//! What the background thread watches: a member whose drive is gone is
//! faulted within seconds and the pool goes on degraded; a member whose
//! calls are slow is logged and counted; free space running low shows in
//! the pool's health and its events.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{test_options, SimPool};
use lograid::{Health, PoolOptions};
use std::time::{Duration, Instant};

/// The test options with the background thread on (it runs the watch).
fn watched() -> PoolOptions {
    PoolOptions {
        background_cleaner: true,
        ..test_options()
    }
}

/// Polls `done` every 50 ms for up to 10 s.
fn within_seconds(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_member_that_vanishes_is_faulted_and_the_pool_goes_on_degraded() {
    let p = SimPool::create_with_options(3, 1, 8 << 20, 0.5, watched());
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    p.volume().write(0, &data).unwrap();
    p.volume().flush().unwrap();
    assert_eq!(p.pool().status().health, Health::Healthy);

    let started = Instant::now();
    p.sims[1].vanish();
    assert!(
        within_seconds(|| p.pool().status().members[1].state == "faulted"),
        "member 1 not faulted: {:?}",
        p.pool().status().members[1]
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let st = p.pool().status();
    assert_eq!(st.health, Health::Degraded, "{:?}", st.health_reasons);
    assert!(
        st.events
            .iter()
            .any(|e| e.message.contains("presence check")
                && e.message.contains("the simulated drive was pulled")),
        "{:?}",
        st.events
    );
    // Degraded, not stopped: reads rebuild, writes and flushes go on.
    let mut back = vec![0u8; data.len()];
    p.volume().read(0, &mut back).unwrap();
    assert!(back == data, "data changed after the member vanished");
    p.volume().write(1 << 20, &data).unwrap();
    p.volume().flush().unwrap();
}

#[test]
fn low_space_shows_in_health_and_events_and_recovers() {
    let p = SimPool::create_with_options(3, 1, 8 << 20, 1.0, watched());
    let st = p.pool().status();
    assert_eq!(st.health, Health::Healthy);
    // Fill to 95% of usable: past the low-space mark.
    let fill = st.usable_bytes / 100 * 95 / 4096 * 4096;
    let chunk = vec![0x33u8; 64 * 1024];
    let mut at = 0;
    while at < fill {
        let n = chunk.len().min((fill - at) as usize);
        p.volume().write(at, &chunk[..n]).unwrap();
        at += n as u64;
    }
    p.volume().flush().unwrap();
    assert!(
        within_seconds(|| p
            .pool()
            .status()
            .events
            .iter()
            .any(|e| e.message.contains("low on space"))),
        "no low-space event: {:?}",
        p.pool().status().events
    );
    let st = p.pool().status();
    assert_eq!(st.health, Health::LowSpace, "{:?}", st.health_reasons);
    assert_eq!(st.health.exit_code(), 1);
    // Trimming gives the room back.
    p.volume().trim(0, fill).unwrap();
    p.volume().flush().unwrap();
    p.pool().checkpoint().unwrap();
    assert!(
        within_seconds(|| p.pool().status().health == Health::Healthy),
        "{:?}",
        p.pool().status().health_reasons
    );
}

/// The log lines of this test process (each test runs in its own process
/// under nextest; the background thread logs, so the subscriber is global).
fn capture_log() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || Sink(sink.clone()))
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    buf
}

struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_member_whose_flush_takes_over_a_second_is_logged_and_counted() {
    let log = capture_log();
    let p = SimPool::create_with_options(3, 1, 8 << 20, 0.5, watched());
    p.volume().write(0, &[0x5a; 64 * 1024]).unwrap();
    p.sims[2].hold(lograid::device::Hold::Flushes);
    std::thread::scope(|scope| {
        let flush = scope.spawn(|| p.volume().flush());
        std::thread::sleep(Duration::from_millis(1300));
        p.sims[2].release();
        flush.join().unwrap().expect("a slow flush still succeeds");
    });
    let st = p.pool().status();
    assert_eq!(
        st.members.iter().map(|m| m.slow_ios).collect::<Vec<_>>(),
        [0, 0, 1],
        "slow calls per member"
    );
    assert!(
        within_seconds(|| {
            let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
            text.lines().any(|l| {
                l.contains("WARN")
                    && l.contains("member 2 (")
                    && l.contains("1 calls took over 1 s (slow I/O")
            })
        }),
        "no slow I/O line: {}",
        String::from_utf8_lossy(&log.lock().unwrap())
    );
    assert_eq!(
        st.members[2].state, "online",
        "a slow member is not faulted"
    );
}
