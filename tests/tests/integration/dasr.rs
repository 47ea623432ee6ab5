//! DASR's ingress program (`pl_tc_ingress`) driven with BPF_PROG_TEST_RUN: as a receiver it
//! counts each flow that sends data once (pure ACKs and padding are not data); as a sender it
//! reads the option of an ACK and sets the share line / N on the real local socket the ACK is
//! for, and ignores options that are malformed or truncated.

use std::net::{TcpListener, TcpStream};

use aya::{TestRun, TestRunOptions};
use paceline::kernel::datapath::Datapath;
use paceline_common::dasr::{
    self, Advert, DasrIface, IFACE_RECEIVE, IFACE_SEND, encode, encode_rate, per_sender_ns,
};
use paceline_common::maps::v4_mapped;
use paceline_tests::{
    packet::{self, L4},
    skb::{SkBuff, mono_now_ns},
};

use crate::privileged;

/// BPF_PROG_TEST_RUN runs on the loopback device.
const LO: u32 = 1;
/// 1 Gbit/s.
const LINE: u64 = 125_000_000;

/// The datapath with loopback served in the roles `flags`, epochs of at least `window_ms`.
/// `None` (after printing SKIPPED) where this kernel's verifier refuses DASR's program.
fn load(test: &str, flags: u32, window_ms: u64) -> Option<crate::test_run::Shared> {
    let mut dp = crate::test_run::load();
    if let Some(why) = dp.dasr_unavailable() {
        eprintln!("SKIPPED: {test}: DASR is unavailable on this kernel: {why}");
        return None;
    }
    let cfg = DasrIface {
        line_rate: LINE,
        min_window_ns: window_ms * 1_000_000,
        per_sender_ns: per_sender_ns(1514, LINE),
        flags,
        line_code: encode_rate(LINE).unwrap(),
        _pad: 0,
    };
    dp.set_dasr_iface(LO, &cfg).unwrap();
    Some(dp)
}

fn run(dp: &mut Datapath, frame: &[u8]) {
    let prog = dp.ingress_program().unwrap();
    let mut out = vec![0u8; frame.len() + 64];
    let ctx = SkBuff {
        ifindex: LO,
        ..SkBuff::default()
    };
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(ctx.as_bytes()),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    assert_eq!(r.return_value as i32, -1, "the ingress program passes everything");
    out.truncate(r.data_size_out as usize);
    assert_eq!(out, frame, "and changes nothing");
}

fn data4(src: [u8; 4], sport: u16, payload: usize) -> Vec<u8> {
    packet::ipv4(
        src,
        [10, 0, 0, 2],
        L4::Tcp { sport, dport: 5000 },
        0,
        0,
        &[],
        None,
        payload,
    )
}

/// N for `addr` as the agent computes it from the map.
fn senders(dp: &Datapath, addr: [u32; 4]) -> u32 {
    let now = dasr::ticks(mono_now_ns());
    dp.dasr_addrs()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == addr)
        .map_or(0, |(_, v)| dasr::senders(&v.view(), now))
}

#[test]
fn receiver_counts_each_flow_with_data_once() {
    if !privileged("receiver_counts_each_flow_with_data_once") {
        return;
    }
    // Epochs of 50 ms: every segment below falls into the first one.
    let Some(mut dp) = load("receiver_counts_each_flow_with_data_once", IFACE_RECEIVE, 50) else {
        return;
    };
    let local = v4_mapped(u32::from_ne_bytes([10, 0, 0, 2]));
    // Three flows with data, one of them many times.
    for _ in 0..5 {
        run(&mut dp, &data4([10, 0, 0, 1], 40000, 1000));
    }
    run(&mut dp, &data4([10, 0, 0, 1], 40001, 1));
    run(&mut dp, &data4([10, 0, 0, 3], 40000, 1448));
    // A pure ACK, and a pure ACK padded to Ethernet's 60 bytes: no data.
    run(&mut dp, &data4([10, 0, 0, 4], 40000, 0));
    let mut padded = data4([10, 0, 0, 5], 40000, 0);
    padded.resize(60, 0);
    run(&mut dp, &padded);
    // UDP is not TCP.
    run(
        &mut dp,
        &packet::ipv4(
            [10, 0, 0, 6],
            [10, 0, 0, 2],
            L4::Udp { sport: 1, dport: 2 },
            0,
            0,
            &[],
            None,
            500,
        ),
    );
    assert_eq!(senders(&dp, local), 3);
    // IPv6 data to another address is counted for that address.
    let a6 = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let b6 = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    run(
        &mut dp,
        &packet::ipv6(a6, b6, L4::Tcp { sport: 1, dport: 2 }, 0, 0, false, 100),
    );
    let mut w = [0u32; 4];
    for (i, c) in b6.chunks(4).enumerate() {
        w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    assert_eq!(senders(&dp, w), 1);
    assert_eq!(senders(&dp, local), 3);
    let s = dp.dasr_stats().unwrap();
    assert_eq!(s.data_segments, 5 + 1 + 1 + 1, "every data segment");
    assert_eq!(s.sightings, 4, "each flow once per epoch");
    // Line rate as advertised for the address.
    let (_, a) = dp
        .dasr_addrs()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == local)
        .unwrap();
    assert_eq!(a.line_rate, LINE);
    // Two epochs later, with no more data, nobody is sending.
    std::thread::sleep(std::time::Duration::from_millis(110));
    assert_eq!(senders(&dp, local), 0);
}

/// An established loopback connection: (client, server side). The test's ACKs are for the
/// client.
fn connection() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

/// An ACK from the server to the client carrying NOP NOP timestamps and `opt` (the option area
/// cut to `area_len` bytes when given: a header that ends inside the option).
fn ack(client: &TcpStream, opt: &[u8]) -> Vec<u8> {
    let sport = client.peer_addr().unwrap().port();
    let dport = client.local_addr().unwrap().port();
    let mut opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
    opts.extend_from_slice(opt);
    while opts.len() % 4 != 0 {
        opts.push(0);
    }
    packet::tcp4_with_options([127, 0, 0, 1], [127, 0, 0, 1], sport, dport, &opts, 0)
}

fn share_of(dp: &Datapath, s: &TcpStream) -> u64 {
    dp.sock_state(s).map_or(0, |st| st.dasr_rate)
}

#[test]
fn sender_sets_the_share_on_the_socket_the_ack_is_for() {
    if !privileged("sender_sets_the_share_on_the_socket_the_ack_is_for") {
        return;
    }
    let Some(mut dp) = load(
        "sender_sets_the_share_on_the_socket_the_ack_is_for",
        IFACE_SEND,
        1,
    ) else {
        return;
    };
    let (client, server) = connection();
    let code = encode_rate(LINE).unwrap();
    run(&mut dp, &ack(&client, &encode(4, code)));
    assert_eq!(
        share_of(&dp, &client),
        LINE / 4,
        "line / N on the client's socket"
    );
    assert_eq!(share_of(&dp, &server), 0, "not on the other end");
    let st = dp.sock_state(&client).unwrap();
    assert!(st.dasr_seen_ns > 0 && st.dasr_seen_ns <= mono_now_ns());
    // N grows: the smaller share applies at once.
    run(&mut dp, &ack(&client, &encode(8, code)));
    assert_eq!(share_of(&dp, &client), LINE / 8);
    // N falls: the larger share waits until the receiver has said so for RAISE_HOLD_NS.
    run(&mut dp, &ack(&client, &encode(2, code)));
    assert_eq!(share_of(&dp, &client), LINE / 8, "a rise is held");
    assert!(dp.sock_state(&client).unwrap().dasr_raise_ns > 0);
    std::thread::sleep(std::time::Duration::from_nanos(dasr::RAISE_HOLD_NS + 100_000));
    run(&mut dp, &ack(&client, &encode(2, code)));
    assert_eq!(share_of(&dp, &client), LINE / 2, "taken after the hold");
    assert_eq!(dp.sock_state(&client).unwrap().dasr_raise_ns, 0);
    // The same share again is not a new one.
    run(&mut dp, &ack(&client, &encode(2, code)));
    let s = dp.dasr_stats().unwrap();
    assert_eq!((s.options_read, s.rates_set), (5, 3));
    assert_eq!(s.rate_hist[dasr::rate_bucket(LINE / 4)], 1);
    assert_eq!(s.rate_hist[dasr::rate_bucket(LINE / 8)], 1);
    assert_eq!(s.rate_hist[dasr::rate_bucket(LINE / 2)], 1);
    // An ACK for a connection that does not exist (another destination port).
    let gone = {
        let sport = client.peer_addr().unwrap().port();
        let dport = client.local_addr().unwrap().port() ^ 0x4000;
        let mut opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        opts.extend_from_slice(&encode(8, code));
        packet::tcp4_with_options([127, 0, 0, 1], [127, 0, 0, 1], sport, dport, &opts, 0)
    };
    run(&mut dp, &gone);
    assert_eq!(dp.dasr_stats().unwrap().options_no_socket, 1);
    assert_eq!(share_of(&dp, &client), LINE / 2);
}

#[test]
fn malformed_and_truncated_options_are_ignored() {
    if !privileged("malformed_and_truncated_options_are_ignored") {
        return;
    }
    let Some(mut dp) = load("malformed_and_truncated_options_are_ignored", IFACE_SEND, 1) else {
        return;
    };
    let (client, _server) = connection();
    let code = encode_rate(LINE).unwrap();
    run(&mut dp, &ack(&client, &encode(5, code)));
    assert_eq!(share_of(&dp, &client), LINE / 5);
    let good = encode(2, code);
    let with = |i: usize, v: u8| {
        let mut b = good;
        b[i] = v;
        b
    };
    let mut bad: Vec<(&str, Vec<u8>, bool)> = vec![
        // (what, option bytes, counted as malformed)
        ("reserved bit set", with(4, 0x80).to_vec(), true),
        ("N = 0", with(5, 0).to_vec(), true),
        (
            "no line rate",
            {
                let mut b = good;
                b[6] = 0x10;
                b[7] = 0;
                b.to_vec()
            },
            true,
        ),
        (
            "length 12 with DASR's ExID",
            {
                let mut b = vec![253, 12, 0xDA, 0x5A, 0, 2];
                b.extend_from_slice(&code.to_be_bytes());
                b.extend_from_slice(&[0, 0, 0, 0]);
                b
            },
            true,
        ),
        ("another experiment's ExID", with(3, 0x03).to_vec(), false),
        (
            "a zero length before it ends the walk",
            {
                let mut b = vec![8, 0, 1, 1];
                b.extend_from_slice(&good);
                b
            },
            false,
        ),
    ];
    // Truncated: the TCP header ends 4 bytes into the option (the bytes after it are payload).
    {
        let sport = client.peer_addr().unwrap().port();
        let dport = client.local_addr().unwrap().port();
        let mut opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        opts.extend_from_slice(&good[..4]);
        let mut f = packet::tcp4_with_options([127, 0, 0, 1], [127, 0, 0, 1], sport, dport, &opts, 4);
        let n = f.len();
        f[n - 4..].copy_from_slice(&good[4..]);
        // (The checksum no longer matches the payload: the ingress program does not look.)
        run(&mut dp, &f);
        assert_eq!(share_of(&dp, &client), LINE / 5, "truncated");
        assert_eq!(dp.dasr_stats().unwrap().options_malformed, 1, "truncated");
    }
    let mut malformed = 1;
    for (what, opt, counted) in bad.drain(..) {
        run(&mut dp, &ack(&client, &opt));
        assert_eq!(share_of(&dp, &client), LINE / 5, "{what}: ignored");
        if counted {
            malformed += 1;
        }
        assert_eq!(dp.dasr_stats().unwrap().options_malformed, malformed, "{what}");
    }
    // And a good one after all that still applies (a rise: once held for RAISE_HOLD_NS).
    run(&mut dp, &ack(&client, &good));
    std::thread::sleep(std::time::Duration::from_nanos(dasr::RAISE_HOLD_NS + 100_000));
    run(&mut dp, &ack(&client, &good));
    assert_eq!(share_of(&dp, &client), LINE / 2);
    let a = Advert::decode(&good).unwrap();
    assert_eq!(a.share(), LINE / 2);
}

#[test]
fn an_interface_not_served_is_left_alone() {
    if !privileged("an_interface_not_served_is_left_alone") {
        return;
    }
    let mut dp = crate::test_run::load();
    if let Some(why) = dp.dasr_unavailable() {
        eprintln!(
            "SKIPPED: an_interface_not_served_is_left_alone: DASR is unavailable on this kernel: {why}"
        );
        return;
    }
    let (client, _server) = connection();
    run(&mut dp, &ack(&client, &encode(4, encode_rate(LINE).unwrap())));
    run(&mut dp, &data4([10, 0, 0, 1], 40000, 1000));
    assert_eq!(share_of(&dp, &client), 0);
    assert!(dp.dasr_addrs().unwrap().is_empty());
    assert_eq!(dp.dasr_stats().unwrap().data_segments, 0);
}
