//! TLS (NBD STARTTLS) end to end: `lograid serve --tls-certificates DIR` with real clients
//! (nbdinfo and qemu-io, both GnuTLS), certificates made with openssl.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs openssl with `args` in `dir`; panics with its output on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a CA, a server certificate for localhost/127.0.0.1 and a client certificate in
/// `dir/ca` (the CA's files), `dir/server` (ca-cert.pem, server-cert.pem, server-key.pem: what
/// the server reads) and `dir/client` (ca-cert.pem, client-cert.pem, client-key.pem: the layout
/// libnbd and qemu read). `dir/other` holds a CA that signed nothing here.
fn make_certificates(dir: &Path) {
    for sub in ["ca", "server", "client", "other"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = dir.join("ca");
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend([
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=lograid test CA",
    ]);
    openssl(&ca, &args);
    let other = dir.join("other");
    openssl(&other, &args);
    std::fs::write(
        ca.join("server.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(
        ca.join("client.cnf"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    for (name, out_dir) in [("server", "server"), ("client", "client")] {
        let key = dir.join(out_dir).join(format!("{name}-key.pem"));
        let cert = dir.join(out_dir).join(format!("{name}-cert.pem"));
        let csr = ca.join(format!("{name}.csr"));
        let mut args = vec!["req"];
        args.extend(ec);
        let subject = format!(
            "/CN={}",
            if name == "server" {
                "localhost"
            } else {
                "client"
            }
        );
        args.extend([
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            csr.to_str().unwrap(),
            "-subj",
            &subject,
        ]);
        openssl(&ca, &args);
        let ext = format!("{name}.cnf");
        openssl(
            &ca,
            &[
                "x509",
                "-req",
                "-in",
                csr.to_str().unwrap(),
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-out",
                cert.to_str().unwrap(),
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
    for sub in ["server", "client"] {
        std::fs::copy(ca.join("ca-cert.pem"), dir.join(sub).join("ca-cert.pem")).unwrap();
    }
}

fn tls_uri(server: &Server, export: &str, client_dir: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{}/{export}?tls-certificates={}",
        server.port,
        client_dir.display()
    )
}

/// qemu-io over TLS; returns its output (qemu-io reports failures in its output).
fn qemu_io_tls(server: &Server, export: &str, client_dir: &Path, commands: &[&str]) -> String {
    let mut cmd = tool("qemu-io");
    cmd.args([
        "--object",
        &format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            client_dir.display()
        ),
        "--image-opts",
        &format!(
            "driver=nbd,host=127.0.0.1,port={},export={export},tls-creds=tls0",
            server.port
        ),
    ]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("running qemu-io");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A fresh pool with certificates made in POOL/certs (see [`make_certificates`]), served with
/// `--tls-certificates POOL/certs/server` and `extra`.
fn tls_pool(extra: &[&str]) -> (TestPool, PathBuf, Server) {
    let pool = TestPool::create("256M", "vol0:32M");
    let certs = pool.path("certs");
    make_certificates(&certs);
    let server_dir = certs.join("server");
    let mut args = vec!["--tls-certificates", server_dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let server = pool.serve_with(&args);
    (pool, certs, server)
}

/// Reads one option reply header (magic, option, type, length) and its data.
fn read_option_reply(stream: &mut impl Read) -> (u32, u32, Vec<u8>) {
    let mut header = [0u8; 20];
    stream.read_exact(&mut header).expect("option reply");
    assert_eq!(&header[0..8], &0x0003_e889_0455_65a9u64.to_be_bytes());
    let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
    let kind = u32::from_be_bytes(header[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(header[16..20].try_into().unwrap());
    let mut data = vec![0u8; len as usize];
    stream.read_exact(&mut data).unwrap();
    (option, kind, data)
}

fn send_option(stream: &mut impl Write, option: u32, data: &[u8]) {
    let mut frame = Vec::new();
    frame.extend_from_slice(b"IHAVEOPT");
    frame.extend_from_slice(&option.to_be_bytes());
    frame.extend_from_slice(&(data.len() as u32).to_be_bytes());
    frame.extend_from_slice(data);
    stream.write_all(&frame).unwrap();
}

const NBD_REP_ACK: u32 = 1;
const NBD_REP_ERR_INVALID: u32 = 0x8000_0003;
const NBD_REP_ERR_TLS_REQD: u32 = 0x8000_0005;

#[test]
fn tls_required_serves_encrypted_clients_and_nothing_else() {
    if !need_tools(&["openssl", "nbdinfo", "qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let certs = pool.path("certs");
    make_certificates(&certs);
    let server = pool.serve_with(&["--tls-certificates", certs.join("server").to_str().unwrap()]);
    assert!(
        server.stdout().contains("TLS required"),
        "{}",
        server.stdout()
    );
    let client = certs.join("client");

    // Encrypted clients: data written over TLS reads back over TLS.
    let info = stdout_of(tool("nbdinfo").arg(tls_uri(&server, "vol0", &client)));
    assert!(info.contains("with TLS"), "{info}");
    assert!(info.contains("export-size: 67108864"), "{info}");
    let out = qemu_io_tls(&server, "vol0", &client, &["write -P 0x3c 1M 1M", "flush"]);
    assert!(out.contains("wrote 1048576/1048576"), "{out}");
    let out = qemu_io_tls(
        &server,
        "vol0",
        &client,
        &["read -P 0x3c 1M 1M", "read -P 0 0 1M"],
    );
    assert!(
        !out.contains("failed") && !out.contains("Pattern verification"),
        "{out}"
    );
    assert_eq!(out.matches("read 1048576/1048576").count(), 2, "{out}");

    // A client that trusts another CA does not connect.
    let out = tool("nbdinfo")
        .arg(tls_uri(&server, "vol0", &certs.join("other")))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a client trusting another CA connected"
    );

    // Plaintext clients get nothing: not the data, not the export list.
    let out = tool("nbdinfo").arg(server.uri("vol0")).output().unwrap();
    assert!(!out.status.success(), "a plaintext client was served");
    let out = tool("nbdinfo")
        .arg("--list")
        .arg(server.base_uri())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !listed.contains("vol0"),
        "the export list leaked in plaintext: {listed}"
    );

    options_before_tls_are_refused(server.port);

    // STARTTLS is acknowledged, then a client that speaks garbage instead of TLS is dropped,
    // and the server goes on serving.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_option(&mut s, 5, &[]);
    assert_eq!(read_option_reply(&mut s).1, NBD_REP_ACK);
    s.write_all(&[0x42; 512]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let info = stdout_of(tool("nbdinfo").arg(tls_uri(&server, "vol0", &client)));
    assert!(info.contains("with TLS"), "{info}");
    let log = server.terminate();
    assert!(log.contains("TLS handshake failed"), "{log}");
}

/// At the protocol level: every option but STARTTLS and ABORT gets NBD_REP_ERR_TLS_REQD;
/// STARTTLS with data is invalid; NBD_OPT_EXPORT_NAME closes the connection.
fn options_before_tls_are_refused(port: u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
    for option in [3u32, 6, 7, 8, 9, 10] {
        send_option(&mut s, option, &[]);
        let (echoed, kind, message) = read_option_reply(&mut s);
        assert_eq!(
            (echoed, kind),
            (option, NBD_REP_ERR_TLS_REQD),
            "option {option}"
        );
        assert!(String::from_utf8_lossy(&message).contains("TLS"));
    }
    send_option(&mut s, 5, b"junk");
    assert_eq!(read_option_reply(&mut s).1, NBD_REP_ERR_INVALID);
    send_option(&mut s, 1, b"vol0");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "EXPORT_NAME before TLS got an answer: {rest:?}"
    );
}

#[test]
fn tls_verify_peer_serves_only_clients_with_a_certificate() {
    if !need_tools(&["openssl", "nbdinfo"]) {
        return;
    }
    let (_pool, certs, server) = tls_pool(&["--tls-verify-peer"]);
    // Only the CA certificate: refused.
    let anonymous = certs.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(certs.join("ca/ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let out = tool("nbdinfo")
        .arg(tls_uri(&server, "vol0", &anonymous))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a client without a certificate was served"
    );
    // With a certificate from the CA: served.
    let info = stdout_of(tool("nbdinfo").arg(tls_uri(&server, "vol0", &certs.join("client"))));
    assert!(info.contains("with TLS"), "{info}");
    server.terminate();
}

#[test]
fn tls_on_lets_clients_choose() {
    if !need_tools(&["openssl", "nbdinfo", "qemu-io"]) {
        return;
    }
    let (_pool, certs, server) = tls_pool(&["--tls", "on"]);
    let out = qemu_io_tls(
        &server,
        "vol0",
        &certs.join("client"),
        &["write -P 0x11 0 64k"],
    );
    assert!(out.contains("wrote 65536/65536"), "{out}");
    let plain = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x11 0 64k",
        &server.uri("vol0"),
    ]));
    assert!(
        plain.contains("read 65536/65536") && !plain.contains("failed"),
        "{plain}"
    );
    let info = stdout_of(tool("nbdinfo").arg(server.uri("vol0")));
    assert!(info.contains("without TLS"), "{info}");
    server.terminate();
}

#[test]
fn tls_flag_errors_are_clear_and_change_nothing() {
    if !need_tools(&["openssl"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:32M");
    let certs = pool.path("certs");
    make_certificates(&certs);
    let server_dir = certs.join("server");
    let fail = |extra: &[&str], expect: &str| {
        let out = lograid()
            .arg("serve")
            .args(&pool.drives)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(
            err.contains(expect),
            "{extra:?}: expected {expect:?} in: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    };
    fail(&["--tls", "require"], "needs --tls-certificates");
    fail(
        &[
            "--tls",
            "off",
            "--tls-certificates",
            server_dir.to_str().unwrap(),
        ],
        "contradicts",
    );
    fail(
        &["--tls-certificates", pool.path("nowhere").to_str().unwrap()],
        "not a directory",
    );
    fail(&["--tls-verify-peer"], "--tls-certificates");
    // A key that does not belong to the certificate.
    let mismatched = certs.join("mismatched");
    std::fs::create_dir_all(&mismatched).unwrap();
    std::fs::copy(
        server_dir.join("server-cert.pem"),
        mismatched.join("server-cert.pem"),
    )
    .unwrap();
    std::fs::copy(
        certs.join("client/client-key.pem"),
        mismatched.join("server-key.pem"),
    )
    .unwrap();
    fail(
        &["--tls-certificates", mismatched.to_str().unwrap()],
        "do not make a server identity",
    );
    // A certificate file that is not PEM.
    let garbage = certs.join("garbage");
    std::fs::create_dir_all(&garbage).unwrap();
    std::fs::write(garbage.join("server-cert.pem"), b"not a certificate").unwrap();
    std::fs::copy(
        server_dir.join("server-key.pem"),
        garbage.join("server-key.pem"),
    )
    .unwrap();
    fail(
        &["--tls-certificates", garbage.to_str().unwrap()],
        "server-cert.pem",
    );
    // --tls-verify-peer without ca-cert.pem.
    let no_ca = certs.join("no-ca");
    std::fs::create_dir_all(&no_ca).unwrap();
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::copy(server_dir.join(f), no_ca.join(f)).unwrap();
    }
    fail(
        &[
            "--tls-certificates",
            no_ca.to_str().unwrap(),
            "--tls-verify-peer",
        ],
        "ca-cert.pem",
    );
    // Nothing was changed: the pool still serves.
    let server = pool.serve();
    server.terminate();
}

#[test]
fn attach_over_tls_makes_a_working_block_device() {
    if !need_tools(&["openssl"]) || !need_block_devices(&[]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let certs = pool.path("certs");
    make_certificates(&certs);
    let server = pool.serve_with(&["--tls-certificates", certs.join("server").to_str().unwrap()]);
    // nbdfuse refuses file paths in URIs; libnbd finds the CA in $HOME/.pki/libnbd.
    let home = pool.path("home");
    std::fs::create_dir_all(home.join(".pki/libnbd")).unwrap();
    std::fs::copy(
        certs.join("ca/ca-cert.pem"),
        home.join(".pki/libnbd/ca-cert.pem"),
    )
    .unwrap();
    let state = pool.path("attach");
    let out = stdout_of(
        lograid()
            .env("HOME", &home)
            .args([
                "attach",
                "--server",
                &format!("nbds://127.0.0.1:{}", server.port),
            ])
            .args(["--export", "vol0", "--state-dir"])
            .arg(&state),
    );
    let device = PathBuf::from(out.trim());
    assert!(out.trim().starts_with("/dev/loop"), "{out}");
    let attachment = Attachment::forget_on_drop(device.clone(), &state);
    let mut rng = Rng::new(7);
    let data = rng.bytes(4 << 20);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&device)
        .unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let back = std::fs::read(&device).unwrap_or_else(|e| {
        panic!(
            "reading {} back: {e}\nserver log:\n{}\nstate dir: {:?}",
            device.display(),
            server.stderr(),
            std::fs::read_dir(&state).map(|d| d
                .flatten()
                .map(|e| (
                    e.file_name(),
                    std::fs::read_to_string(e.path()).unwrap_or_default()
                ))
                .collect::<Vec<_>>())
        )
    });
    assert_eq!(back[..data.len()], data[..]);
    attachment.detach();
    // What went through the encrypted block device is on the volume.
    let out = qemu_io_tls(&server, "vol0", &certs.join("client"), &["read -v 0 16"]);
    let first: String = data[..16].iter().map(|b| format!("{b:02x} ")).collect();
    assert!(out.contains(first.trim()), "expected {first} in {out}");
    server.terminate();
}

const NBD_OPT_STARTTLS: u32 = 5;
const NBD_OPT_GO: u32 = 7;
const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;

/// A raw NBD client on `stream` (past STARTTLS if any): structured replies, GO on `export`,
/// then one READ of `length` bytes at `offset`. Returns each reply chunk's type and payload.
fn read_with_structured_replies(
    stream: &mut (impl Read + Write),
    export: &str,
    offset: u64,
    length: u32,
) -> Vec<(u16, Vec<u8>)> {
    send_option(stream, NBD_OPT_STRUCTURED_REPLY, &[]);
    let (_, kind, _) = read_option_reply(stream);
    assert_eq!(kind, NBD_REP_ACK, "structured replies refused");
    let mut go = (export.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(export.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    send_option(stream, NBD_OPT_GO, &go);
    loop {
        let (_, kind, _) = read_option_reply(stream);
        if kind == NBD_REP_ACK {
            break;
        }
        assert!(kind < 0x8000_0000, "GO refused: {kind:#x}");
    }
    let mut request = Vec::new();
    request.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    request.extend_from_slice(&0u16.to_be_bytes()); // flags
    request.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
    request.extend_from_slice(&7u64.to_be_bytes()); // cookie
    request.extend_from_slice(&offset.to_be_bytes());
    request.extend_from_slice(&length.to_be_bytes());
    stream.write_all(&request).unwrap();
    let mut chunks = Vec::new();
    loop {
        let mut header = [0u8; 20];
        stream.read_exact(&mut header).unwrap();
        assert_eq!(
            u32::from_be_bytes(header[0..4].try_into().unwrap()),
            0x668e_33ef
        );
        let flags = u16::from_be_bytes(header[4..6].try_into().unwrap());
        let kind = u16::from_be_bytes(header[6..8].try_into().unwrap());
        assert_eq!(u64::from_be_bytes(header[8..16].try_into().unwrap()), 7);
        let len = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut payload = vec![0u8; len as usize];
        stream.read_exact(&mut payload).unwrap();
        chunks.push((kind, payload));
        if flags & 1 != 0 {
            break;
        }
    }
    // NBD_CMD_DISC.
    let mut disc = Vec::new();
    disc.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    disc.extend_from_slice(&0u16.to_be_bytes());
    disc.extend_from_slice(&2u16.to_be_bytes());
    disc.extend_from_slice(&[0u8; 20]);
    let _ = stream.write_all(&disc);
    chunks
}

/// Connects, reads the server's opening and sends the client flags (fixed newstyle, no zeroes).
fn connect_raw(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut opening = [0u8; 18];
    stream.read_exact(&mut opening).unwrap();
    assert_eq!(&opening[0..8], b"NBDMAGIC");
    stream.write_all(&3u32.to_be_bytes()).unwrap();
    stream
}

/// Over TLS a read of never-written blocks is answered with data chunks of zero bytes, never
/// with hole chunks (which nbdfuse over GnuTLS failed on; docs/OPERATIONS.md, TLS). The same
/// read in plaintext on the same server gets a hole chunk: the check can tell them apart.
#[test]
fn tls_answers_holes_with_zero_bytes_and_plaintext_with_hole_chunks() {
    if !need_tools(&["openssl"]) {
        return;
    }
    let (_pool, certs, server) = tls_pool(&["--tls", "on"]);
    let (offset, length) = (1u64 << 20, 256u32 << 10);

    let mut plain = connect_raw(&server);
    let chunks = read_with_structured_replies(&mut plain, "vol0", offset, length);
    assert!(
        chunks
            .iter()
            .any(|(kind, _)| *kind == NBD_REPLY_TYPE_OFFSET_HOLE),
        "plaintext: no hole chunk in {:?}",
        chunks.iter().map(|c| c.0).collect::<Vec<_>>()
    );

    let mut tcp = connect_raw(&server);
    send_option(&mut tcp, NBD_OPT_STARTTLS, &[]);
    let (_, kind, _) = read_option_reply(&mut tcp);
    assert_eq!(kind, NBD_REP_ACK, "STARTTLS refused");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in
        rustls::pki_types::CertificateDer::pem_file_iter(certs.join("client/ca-cert.pem")).unwrap()
    {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let chunks = read_with_structured_replies(&mut tls, "vol0", offset, length);
    let kinds: Vec<u16> = chunks.iter().map(|c| c.0).collect();
    assert!(
        !kinds.contains(&NBD_REPLY_TYPE_OFFSET_HOLE),
        "TLS: a hole chunk in {kinds:?}"
    );
    let mut covered = 0u64;
    for (kind, payload) in &chunks {
        if *kind == NBD_REPLY_TYPE_OFFSET_DATA {
            assert!(
                payload[8..].iter().all(|&b| b == 0),
                "a never-written block read non-zero"
            );
            covered += (payload.len() - 8) as u64;
        }
    }
    assert_eq!(
        covered,
        u64::from(length),
        "TLS: data chunks covered {covered} of {length} bytes ({kinds:?})"
    );
    drop(tls);
    drop(plain);
    server.terminate();
}
