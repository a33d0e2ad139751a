//! The decoder against RFC 7541 Appendix C, and the table-free encoder.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn decode(d: &mut Decoder, block: &str) -> Result<Vec<(String, String)>, DecodeError> {
    let mut fields = Vec::new();
    d.decode(&hex(block), usize::MAX, &mut fields)?;
    Ok(fields
        .into_iter()
        .map(|f| {
            (
                String::from_utf8(f.name.to_vec()).unwrap(),
                String::from_utf8(f.value.to_vec()).unwrap(),
            )
        })
        .collect())
}

fn list(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn integers_of_rfc_c1() {
    let mut pos = 0;
    assert_eq!(integer(&[0b1110_1010], &mut pos, 5), Ok(10));
    let mut pos = 0;
    assert_eq!(integer(&[0x1f, 0x9a, 0x0a], &mut pos, 5), Ok(1337));
    assert_eq!(pos, 3);
    let mut pos = 0;
    assert_eq!(integer(&[42], &mut pos, 7), Ok(42));
    for (value, prefix) in [
        (10, 5),
        (1337, 5),
        (126, 7),
        (127, 7),
        (1 << 20, 4),
        (15, 4),
    ] {
        let mut out = Vec::new();
        put_integer(&mut out, 0, prefix, value);
        let mut pos = 0;
        assert_eq!(integer(&out, &mut pos, prefix), Ok(value));
        assert_eq!(pos, out.len());
    }
    let mut out = Vec::new();
    put_integer(&mut out, 0, 5, 1337);
    assert_eq!(out, [0x1f, 0x9a, 0x0a]);
}

#[test]
fn representations_of_rfc_c2() {
    let mut d = Decoder::new(4096);
    let got = decode(
        &mut d,
        "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
    );
    assert_eq!(got, Ok(list(&[("custom-key", "custom-header")])));
    assert_eq!(d.table_size(), 55);

    let mut d = Decoder::new(4096);
    let got = decode(&mut d, "040c 2f73 616d 706c 652f 7061 7468");
    assert_eq!(got, Ok(list(&[(":path", "/sample/path")])));
    assert_eq!(d.table_size(), 0);

    let mut d = Decoder::new(4096);
    let mut fields = Vec::new();
    d.decode(
        &hex("1008 7061 7373 776f 7264 0673 6563 7265 74"),
        usize::MAX,
        &mut fields,
    )
    .unwrap();
    assert_eq!(fields[0].name, "password");
    assert_eq!(fields[0].value, "secret");
    assert!(fields[0].never_indexed);
    assert_eq!(d.table_size(), 0);

    let mut d = Decoder::new(4096);
    assert_eq!(decode(&mut d, "82"), Ok(list(&[(":method", "GET")])));
}

/// C.3 (plain) and C.4 (Huffman): three requests on one connection.
#[test]
fn requests_of_rfc_c3_and_c4() {
    let blocks = [
        [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ],
        [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ],
    ];
    let authority = (":authority", "www.example.com");
    let lists = [
        list(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            authority,
        ]),
        list(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            authority,
            ("cache-control", "no-cache"),
        ]),
        list(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            authority,
            ("custom-key", "custom-value"),
        ]),
    ];
    for blocks in blocks {
        let mut d = Decoder::new(4096);
        for ((block, want), size) in blocks.iter().zip(&lists).zip([57, 110, 164]) {
            assert_eq!(decode(&mut d, block).as_ref(), Ok(want));
            assert_eq!(d.table_size(), size);
        }
    }
}

/// C.5 (plain) and C.6 (Huffman): three responses with a 256-byte table,
/// so entries are evicted.
#[test]
fn responses_of_rfc_c5_and_c6_evict() {
    let blocks = [
        [
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
             6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
             54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
             5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
             3d31",
        ],
        [
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            "4883 640e ffc1 c0bf",
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab \
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f \
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ],
    ];
    let date1 = ("date", "Mon, 21 Oct 2013 20:13:21 GMT");
    let location = ("location", "https://www.example.com");
    let lists = [
        list(&[
            (":status", "302"),
            ("cache-control", "private"),
            date1,
            location,
        ]),
        list(&[
            (":status", "307"),
            ("cache-control", "private"),
            date1,
            location,
        ]),
        list(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            location,
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ]),
    ];
    for blocks in blocks {
        let mut d = Decoder::new(256);
        for ((block, want), size) in blocks.iter().zip(&lists).zip([222, 222, 215]) {
            assert_eq!(decode(&mut d, block).as_ref(), Ok(want));
            assert_eq!(d.table_size(), size);
        }
    }
}

#[test]
fn malformed_blocks_are_refused() {
    let cases = [
        ("80", DecodeError::BadIndex),
        ("be", DecodeError::BadIndex),
        ("7f00", DecodeError::BadIndex),
        ("4005 6162", DecodeError::Truncated),
        ("41", DecodeError::Truncated),
        ("ff80 8080 8001", DecodeError::IntegerTooLong),
        ("8220", DecodeError::BadSizeUpdate),
        ("3fe2 1f", DecodeError::BadSizeUpdate),
        ("4181 ff", DecodeError::Huffman(HuffmanError::Padding)),
    ];
    for (block, want) in cases {
        let mut d = Decoder::new(4096);
        assert_eq!(decode(&mut d, block), Err(want), "{block}");
    }
    // Size updates at the start are fine, up to the limit: 4096, then 0.
    let mut d = Decoder::new(4096);
    assert_eq!(
        decode(&mut d, "3fe1 1f20 82"),
        Ok(list(&[(":method", "GET")]))
    );
    // Header list over the caller's limit.
    let mut fields = Vec::new();
    let block = hex("8286 84");
    assert_eq!(
        d.decode(&block, 3 * 40, &mut fields),
        Err(DecodeError::ListTooLarge)
    );
}

#[test]
fn size_updates_evict_and_an_oversized_entry_empties_the_table() {
    let mut d = Decoder::new(4096);
    decode(
        &mut d,
        "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
    )
    .unwrap();
    assert_eq!(d.table_size(), 55);
    // Shrink to 0 then back to 4096: the entry is gone.
    decode(&mut d, "4001 6101 62").unwrap();
    decode(&mut d, "203f e11f 82").unwrap();
    assert_eq!(d.table_size(), 0);
    assert_eq!(decode(&mut d, "be"), Err(DecodeError::BadIndex));
    // With a 40-byte table, a 34-byte entry fits, a 42-byte one empties it.
    let mut d = Decoder::new(40);
    decode(&mut d, "4001 6101 62").unwrap();
    assert_eq!(d.table_size(), 34);
    decode(&mut d, "4001 6109 3132 3334 3536 3738 39").unwrap();
    assert_eq!(d.table_size(), 0);
}

#[test]
fn put_field_round_trips_without_the_table() {
    let fields = [
        (":method", "POST", false, "83"),
        (":scheme", "http", false, "86"),
        (":path", "/x", false, "0402 2f78"),
        (
            ":authority",
            "localhost",
            false,
            "0109 6c6f 6361 6c68 6f73 74",
        ),
        ("te", "trailers", false, "0002 7465 0874 7261 696c 6572 73"),
        ("authorization", "secret", true, "1f08 0673 6563 7265 74"),
        (":method", "GET", true, "1203 4745 54"),
    ];
    let mut block = Vec::new();
    for (name, value, never, want) in fields {
        let mut one = Vec::new();
        put_field(&mut one, name.as_bytes(), value.as_bytes(), never);
        assert_eq!(one, hex(want), "{name}");
        block.extend_from_slice(&one);
    }
    let mut d = Decoder::new(4096);
    let mut got = Vec::new();
    d.decode(&block, usize::MAX, &mut got).unwrap();
    assert_eq!(d.table_size(), 0);
    let got: Vec<_> = got
        .iter()
        .map(|f| (f.name.to_vec(), f.value.to_vec(), f.never_indexed))
        .collect();
    let want: Vec<_> = fields
        .iter()
        .map(|(n, v, never, _)| (n.as_bytes().to_vec(), v.as_bytes().to_vec(), *never))
        .collect();
    assert_eq!(got, want);
}
