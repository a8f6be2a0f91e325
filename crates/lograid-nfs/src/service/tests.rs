use super::*;
use crate::fuzzing::{call_record, framed, fuzz_service, fuzz_stream, FUZZ_POOL_UUID};
use crate::handle::HANDLE_BYTES;
use proptest::prelude::*;

/// The accept_stat and the results of a reply.
fn results(reply: &Outcome) -> (u32, XdrReader<'_>) {
    let Outcome::Reply(bytes) = reply else {
        panic!("no reply: {reply:?}");
    };
    let mut reader = XdrReader::new(&bytes[4..]);
    reader.u32().unwrap(); // xid
    assert_eq!(reader.u32().unwrap(), 1, "REPLY");
    assert_eq!(reader.u32().unwrap(), 0, "MSG_ACCEPTED");
    reader.u32().unwrap();
    reader.opaque(400).unwrap();
    let accept_stat = reader.u32().unwrap();
    (accept_stat, reader)
}

fn nfs(service: &Service, procedure: u32, args: &[u8]) -> Outcome {
    service.handle_record(&call_record(7, PROGRAM, VERSION, procedure, args))
}

fn args(build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    build(&mut out);
    out
}

fn skip_fattr(reader: &mut XdrReader<'_>) -> Fattr {
    let file_type = reader.u32().unwrap();
    let mode = reader.u32().unwrap();
    let nlink = reader.u32().unwrap();
    let uid = reader.u32().unwrap();
    let gid = reader.u32().unwrap();
    let size = reader.u64().unwrap();
    let used = reader.u64().unwrap();
    reader.u64().unwrap();
    let fsid = reader.u64().unwrap();
    let file_id = reader.u64().unwrap();
    let mut times = [0u32; 3];
    for time in &mut times {
        *time = reader.u32().unwrap();
        reader.u32().unwrap();
    }
    Fattr {
        file_type,
        mode,
        nlink,
        uid,
        gid,
        size,
        used,
        fsid,
        file_id,
        atime: times[0],
        mtime: times[1],
        ctime: times[2],
    }
}

fn skip_wcc(reader: &mut XdrReader<'_>) {
    if reader.bool().unwrap() {
        reader.u64().unwrap();
        reader.u64().unwrap();
        reader.u64().unwrap();
    }
    if reader.bool().unwrap() {
        skip_fattr(reader);
    }
}

fn mount_root(service: &Service) -> Vec<u8> {
    let reply = service.handle_record(&call_record(
        1,
        100_005,
        3,
        1,
        &args(|a| a.put_opaque(b"/")),
    ));
    let (stat, mut reader) = results(&reply);
    assert_eq!(stat, 0);
    assert_eq!(reader.u32().unwrap(), 0, "MNT3_OK");
    let handle = reader.opaque(64).unwrap().to_vec();
    assert_eq!(handle.len(), HANDLE_BYTES);
    handle
}

fn lookup(service: &Service, root: &[u8], name: &str) -> Result<Vec<u8>, u32> {
    let reply = nfs(
        service,
        PROC_LOOKUP,
        &args(|a| {
            a.put_opaque(root);
            a.put_opaque(name.as_bytes());
        }),
    );
    let (_, mut reader) = results(&reply);
    match reader.u32().unwrap() {
        NFS3_OK => Ok(reader.opaque(64).unwrap().to_vec()),
        status => Err(status),
    }
}

fn write(
    service: &Service,
    handle: &[u8],
    offset: u64,
    data: &[u8],
    stable: u32,
) -> Result<(u32, [u8; 8]), u32> {
    let reply = nfs(
        service,
        PROC_WRITE,
        &args(|a| {
            a.put_opaque(handle);
            a.put_u64(offset);
            a.put_u32(data.len() as u32);
            a.put_u32(stable);
            a.put_opaque(data);
        }),
    );
    let (stat, mut reader) = results(&reply);
    assert_eq!(stat, 0);
    let status = reader.u32().unwrap();
    skip_wcc(&mut reader);
    if status != NFS3_OK {
        return Err(status);
    }
    assert_eq!(reader.u32().unwrap(), data.len() as u32);
    let committed = reader.u32().unwrap();
    let verifier: [u8; 8] = reader.opaque_fixed(8).unwrap().try_into().unwrap();
    Ok((committed, verifier))
}

fn read(service: &Service, handle: &[u8], offset: u64, count: u32) -> Result<(Vec<u8>, bool), u32> {
    let reply = nfs(
        service,
        PROC_READ,
        &args(|a| {
            a.put_opaque(handle);
            a.put_u64(offset);
            a.put_u32(count);
        }),
    );
    let (_, mut reader) = results(&reply);
    let status = reader.u32().unwrap();
    if reader.bool().unwrap() {
        skip_fattr(&mut reader);
    }
    if status != NFS3_OK {
        return Err(status);
    }
    let count = reader.u32().unwrap();
    let eof = reader.bool().unwrap();
    let data = reader.opaque(u32::MAX).unwrap().to_vec();
    assert_eq!(data.len(), count as usize);
    Ok((data, eof))
}

fn commit(service: &Service, handle: &[u8]) -> Result<[u8; 8], u32> {
    let reply = nfs(
        service,
        PROC_COMMIT,
        &args(|a| {
            a.put_opaque(handle);
            a.put_u64(0);
            a.put_u32(0);
        }),
    );
    let (_, mut reader) = results(&reply);
    let status = reader.u32().unwrap();
    skip_wcc(&mut reader);
    if status != NFS3_OK {
        return Err(status);
    }
    Ok(reader.opaque_fixed(8).unwrap().try_into().unwrap())
}

fn getattr(service: &Service, handle: &[u8]) -> Result<Fattr, u32> {
    let reply = nfs(service, PROC_GETATTR, &args(|a| a.put_opaque(handle)));
    let (_, mut reader) = results(&reply);
    match reader.u32().unwrap() {
        NFS3_OK => Ok(skip_fattr(&mut reader)),
        status => Err(status),
    }
}

fn setattr_size(service: &Service, handle: &[u8], size: u64) -> u32 {
    let reply = nfs(
        service,
        PROC_SETATTR,
        &args(|a| {
            a.put_opaque(handle);
            for _ in 0..3 {
                a.put_bool(false);
            }
            a.put_bool(true);
            a.put_u64(size);
            a.put_u32(0);
            a.put_u32(0);
            a.put_bool(false);
        }),
    );
    results(&reply).1.u32().unwrap()
}

#[test]
fn files_are_the_volumes_fixed_size() {
    let service = fuzz_service();
    let root = mount_root(&service);
    let vol0 = lookup(&service, &root, "vol0").unwrap();
    assert_eq!(lookup(&service, &root, "nothing"), Err(NFS3ERR_NOENT));
    assert_eq!(lookup(&service, &vol0, "x"), Err(NFS3ERR_NOTDIR));
    assert_eq!(
        lookup(&service, &root, &"n".repeat(300)),
        Err(NFS3ERR_NAMETOOLONG)
    );
    let attr = getattr(&service, &vol0).unwrap();
    assert_eq!(
        (attr.file_type, attr.size, attr.nlink, attr.mode),
        (NF3REG, 1 << 20, 1, 0o666)
    );
    assert_eq!(getattr(&service, &root).unwrap().file_type, NF3DIR);
    assert_eq!(setattr_size(&service, &vol0, 1 << 20), NFS3_OK);
    assert_eq!(setattr_size(&service, &vol0, 2 << 20), NFS3ERR_FBIG);
    assert_eq!(setattr_size(&service, &vol0, 0), NFS3ERR_INVAL);
    assert_eq!(getattr(&service, &vol0).unwrap().size, 1 << 20);
    assert_eq!(
        write(&service, &vol0, (1 << 20) - 10, &[1; 11], UNSTABLE),
        Err(NFS3ERR_FBIG)
    );
    assert_eq!(
        write(&service, &vol0, u64::MAX - 2, &[1; 11], UNSTABLE),
        Err(NFS3ERR_FBIG)
    );
    let ro = lookup(&service, &root, "ro").unwrap();
    assert_eq!(getattr(&service, &ro).unwrap().mode, 0o444);
    assert_eq!(
        write(&service, &ro, 0, &[1; 512], FILE_SYNC),
        Err(NFS3ERR_ROFS)
    );
    assert_eq!(setattr_size(&service, &ro, 0), NFS3ERR_ROFS);
    let (data, eof) = read(&service, &ro, 60 << 10, 1 << 20).unwrap();
    assert_eq!((data.len(), eof), (4 << 10, true));
    assert_eq!(read(&service, &ro, 1 << 40, 10).unwrap(), (vec![], true));
    assert_eq!(read(&service, &root, 0, 10), Err(NFS3ERR_ISDIR));
}

#[test]
fn unaligned_writes_read_back_and_commit_keeps_the_verifier() {
    let service = fuzz_service();
    let root = mount_root(&service);
    let vol0 = lookup(&service, &root, "vol0").unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let (committed, verifier) = write(&service, &vol0, 777, &data, UNSTABLE).unwrap();
    assert_eq!(committed, UNSTABLE);
    assert_eq!(
        write(&service, &vol0, 4096, &data, DATA_SYNC).unwrap(),
        (FILE_SYNC, verifier)
    );
    assert_eq!(commit(&service, &vol0).unwrap(), verifier);
    let (back, eof) = read(&service, &vol0, 777, 3000).unwrap();
    assert!(!eof);
    assert_eq!(back, data);
    let (edge, _) = read(&service, &vol0, 770, 7).unwrap();
    assert_eq!(edge, vec![0; 7]);
    // Another server start: a new verifier, and the handles still name the same files.
    let restarted = fuzz_service();
    assert_ne!(commit(&restarted, &vol0).unwrap(), verifier);
    assert_eq!(getattr(&restarted, &vol0).unwrap().size, 1 << 20);
}

#[test]
fn strangers_get_errors_not_answers() {
    let service = fuzz_service();
    let root = mount_root(&service);
    let other_pool = crate::handle::encode(FUZZ_POOL_UUID + 1, Node::Root);
    assert_eq!(getattr(&service, &other_pool), Err(NFS3ERR_STALE));
    let deleted = crate::handle::encode(FUZZ_POOL_UUID, Node::Volume(99));
    assert_eq!(getattr(&service, &deleted), Err(NFS3ERR_STALE));
    assert_eq!(getattr(&service, b"garbage"), Err(NFS3ERR_BADHANDLE));
    // Truncated arguments: GARBAGE_ARGS, nothing done.
    assert_eq!(
        results(&nfs(&service, PROC_WRITE, &root[..10])).0,
        rpc::GARBAGE_ARGS
    );
    assert_eq!(
        results(&service.handle_record(&call_record(1, 100_004, 3, 0, &[]))).0,
        rpc::PROG_UNAVAIL
    );
    assert_eq!(
        results(&service.handle_record(&call_record(1, PROGRAM, 2, 0, &[]))).0,
        rpc::PROG_MISMATCH
    );
    assert_eq!(results(&nfs(&service, 22, &[])).0, rpc::PROC_UNAVAIL);
    let create = nfs(&service, PROC_CREATE, &[]);
    assert_eq!(results(&create).1.u32().unwrap(), NFS3ERR_ACCES);
    let mnt = service.handle_record(&call_record(
        1,
        100_005,
        3,
        1,
        &args(|a| a.put_opaque(b"/etc")),
    ));
    assert_eq!(results(&mnt).1.u32().unwrap(), 2);
    assert!(matches!(
        service.handle_record(&[0, 0, 0]),
        Outcome::Close(_)
    ));
}

#[test]
fn calls_are_counted_by_procedure_whatever_their_outcome() {
    let service = fuzz_service();
    let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let root = mount_root(&service);
    let vol0 = lookup(&service, &root, "vol0").unwrap();
    write(&service, &vol0, 0, &[1; 4096], UNSTABLE).unwrap();
    write(&service, &vol0, 4096, &[2; 100], FILE_SYNC).unwrap();
    commit(&service, &vol0).unwrap();
    // A refused WRITE and one whose arguments do not parse count as WRITEs too.
    let ro = lookup(&service, &root, "ro").unwrap();
    assert!(write(&service, &ro, 0, &[1; 512], FILE_SYNC).is_err());
    nfs(&service, PROC_WRITE, &root[..10]);
    service.handle_record(&call_record(1, 100_227, 3, 0, &[]));
    service.handle_record(&call_record(1, PROGRAM, 2, 0, &[]));
    nfs(&service, 22, &[]);
    let c = &service.counters;
    let names = crate::nfs3::PROCEDURE_NAMES;
    let by_name = |name: &str| count(&c.nfs_calls[names.iter().position(|n| *n == name).unwrap()]);
    assert_eq!(by_name("write"), 4);
    assert_eq!(by_name("commit"), 1);
    assert_eq!(by_name("lookup"), 2);
    assert_eq!(by_name("read"), 0);
    assert_eq!(count(&c.mount_calls[1]), 1, "MNT");
    assert_eq!(mount::PROCEDURE_NAMES[1], "mnt");
    assert_eq!(count(&c.unserved_calls), 3);
    assert_eq!(count(&c.writes), 2, "writes done");
    assert_eq!(count(&c.written_bytes), 4196);
    let total: u64 = c.nfs_calls.iter().chain(&c.mount_calls).map(count).sum();
    assert_eq!(total + count(&c.unserved_calls), count(&c.calls));
}

#[test]
fn readdir_lists_every_volume_within_the_count() {
    let service = fuzz_service();
    let root = mount_root(&service);
    let list = |cookie: u64, count: u32, plus: bool| {
        let reply = nfs(
            &service,
            if plus { PROC_READDIRPLUS } else { PROC_READDIR },
            &args(|a| {
                a.put_opaque(&root);
                a.put_u64(cookie);
                a.put_opaque_fixed(&[0; 8]);
                a.put_u32(count);
                if plus {
                    a.put_u32(count);
                }
            }),
        );
        let Outcome::Reply(bytes) = &reply else {
            panic!()
        };
        let (_, mut reader) = results(&reply);
        let status = reader.u32().unwrap();
        if status != NFS3_OK {
            return Err(status);
        }
        assert!(
            bytes.len() - 4 - 24 <= count as usize,
            "reply over its count"
        );
        if reader.bool().unwrap() {
            skip_fattr(&mut reader);
        }
        reader.opaque_fixed(8).unwrap();
        let mut names = Vec::new();
        let mut last_cookie = 0;
        while reader.bool().unwrap() {
            reader.u64().unwrap();
            names.push(String::from_utf8(reader.opaque(255).unwrap().to_vec()).unwrap());
            last_cookie = reader.u64().unwrap();
            if plus {
                assert!(reader.bool().unwrap());
                skip_fattr(&mut reader);
                assert!(reader.bool().unwrap());
                reader.opaque(64).unwrap();
            }
        }
        Ok((names, last_cookie, reader.bool().unwrap()))
    };
    for plus in [false, true] {
        let (names, _, eof) = list(0, 8192, plus).unwrap();
        assert_eq!(names, [".", "..", "vol0", "ro"]);
        assert!(eof);
        let (first, cookie, eof) = list(0, if plus { 270 } else { 150 }, plus).unwrap();
        assert_eq!((first.len(), eof), (1, false), "{first:?}");
        let (rest, _, eof) = list(cookie, 8192, plus).unwrap();
        assert_eq!((rest.len(), eof), (3, true));
        assert_eq!(list(0, 20, plus), Err(NFS3ERR_TOOSMALL));
    }
}

/// A valid NFS or MOUNT call header around arbitrary arguments, or arbitrary bytes.
fn any_record() -> impl Strategy<Value = Vec<u8>> {
    let args = prop::collection::vec(any::<u8>(), 0..200);
    let handle = prop_oneof![
        Just(crate::handle::encode(FUZZ_POOL_UUID, Node::Volume(1)).to_vec()),
        Just(crate::handle::encode(FUZZ_POOL_UUID, Node::Root).to_vec()),
        prop::collection::vec(any::<u8>(), 0..70),
    ];
    prop_oneof![
        (0u32..24, handle, args.clone()).prop_map(|(procedure, handle, tail)| {
            let mut body = Vec::new();
            body.put_opaque(&handle);
            body.extend_from_slice(&tail);
            call_record(1, PROGRAM, VERSION, procedure, &body)
        }),
        (0u32..7, args.clone())
            .prop_map(|(procedure, tail)| call_record(2, 100_005, 3, procedure, &tail)),
        prop::collection::vec(any::<u8>(), 0..300),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever a client sends, every record gets a well-formed reply or ends the connection,
    /// and nothing panics (the fuzz target's check, over structured input).
    #[test]
    fn any_call_gets_a_well_formed_answer(records in prop::collection::vec(any_record(), 1..6)) {
        let service = fuzz_service();
        let stream: Vec<u8> = records.iter().flat_map(|record| framed(record)).collect();
        fuzz_stream(&service, &stream);
    }

    #[test]
    fn any_bytes_are_survived(stream in prop::collection::vec(any::<u8>(), 0..600)) {
        fuzz_stream(&fuzz_service(), &stream);
    }
}

/// The fuzz target's corpus: every input is survived (the fuzz check), and the hand-made seeds
/// (`seed-*`: well-formed calls of every kind) are answered whole.
#[test]
fn fuzz_corpus_is_survived_and_seeds_are_answered() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nfs_proto");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let stream = std::fs::read(&path).unwrap();
        let answered = fuzz_stream(&fuzz_service(), &stream);
        if !path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("seed-")
        {
            continue;
        }
        let mut records = 0;
        let mut position = 0;
        while position + 4 <= stream.len() {
            let mark = u32::from_be_bytes(stream[position..position + 4].try_into().unwrap());
            position += 4 + (mark & 0x7fff_ffff) as usize;
            records += usize::from(mark & 0x8000_0000 != 0);
        }
        assert_eq!(answered, records, "{}", path.display());
        seeds += 1;
    }
    assert!(seeds >= 8);
}
