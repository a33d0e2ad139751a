//! Ed25519 private keys in the PKCS#8 form every mainstream stack reads.
//!
//! *ring* (behind rcgen) generates Ed25519 keys as PKCS#8 v2 (RFC 5958:
//! version 1, public key attached). OpenSSL 3, BoringSSL and
//! pyca/cryptography refuse that form, so every Ed25519 key this PKI
//! writes is PKCS#8 v1 instead (version 0, no public key), as Go's
//! `x509.MarshalPKCS8PrivateKey` writes it. Reading accepts both: rcgen
//! and rustls load either form.

use std::path::Path;

use rcgen::{KeyPair, PKCS_ED25519, PublicKeyData};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::{PkiError, files};

/// The DER of an Ed25519 PKCS#8 v1 key up to its 32-byte seed:
/// `SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING {
/// OCTET STRING (32 bytes) } }`.
const V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The same up to the seed in *ring*'s PKCS#8 v2 form, which is followed
/// by the public key, `[1] IMPLICIT BIT STRING` ([`V2_PUBLIC_TAG`] then
/// 32 bytes).
const V2_PREFIX: [u8; 16] = [
    0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// What follows the seed in *ring*'s v2 form, before the 32 public bytes.
const V2_PUBLIC_TAG: [u8; 3] = [0x81, 0x21, 0x00];

/// Length of an Ed25519 seed (the private key) and of a public key.
const ED25519_LEN: usize = 32;

/// The seed of an Ed25519 PKCS#8 key in the v1 form, or in the v2 form
/// *ring* writes; `None` for anything else (another key type, or a v2
/// document with attributes).
fn ed25519_seed(der: &[u8]) -> Option<&[u8]> {
    let (prefix, rest) = der.split_at_checked(V1_PREFIX.len())?;
    if prefix == V1_PREFIX && rest.len() == ED25519_LEN {
        return Some(rest);
    }
    if prefix != V2_PREFIX {
        return None;
    }
    let (seed, public) = rest.split_at_checked(ED25519_LEN)?;
    let public = public.strip_prefix(&V2_PUBLIC_TAG)?;
    (public.len() == ED25519_LEN).then_some(seed)
}

/// `der` as an Ed25519 PKCS#8 v1 document, when it is an Ed25519 key in
/// the v1 or *ring* v2 form; `None` for anything else.
pub(crate) fn ed25519_pkcs8_v1(der: &[u8]) -> Option<Vec<u8>> {
    let seed = ed25519_seed(der)?;
    let mut v1 = Vec::with_capacity(V1_PREFIX.len() + ED25519_LEN);
    v1.extend_from_slice(&V1_PREFIX);
    v1.extend_from_slice(seed);
    Some(v1)
}

/// Whether `der` is an Ed25519 key in *ring*'s PKCS#8 v2 form, which
/// [`ed25519_pkcs8_v1`] turns into the v1 form.
pub(crate) fn is_ed25519_pkcs8_v2(der: &[u8]) -> bool {
    der.starts_with(&V2_PREFIX) && ed25519_seed(der).is_some()
}

/// `key` (an Ed25519 key) again, serializing as PKCS#8 v1: the same key,
/// reloaded from its v1 document, checked to have the same public key.
pub(crate) fn to_pkcs8_v1(key: &KeyPair) -> Result<KeyPair, PkiError> {
    let origin = "Ed25519 key";
    let v1 = ed25519_pkcs8_v1(&key.serialize_der())
        .ok_or_else(|| PkiError::invalid(origin, "not an Ed25519 PKCS#8 key"))?;
    let reloaded =
        KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(v1), &PKCS_ED25519)
            .map_err(PkiError::crypto("load an Ed25519 key as PKCS#8 v1"))?;
    if reloaded.der_bytes() != key.der_bytes() {
        return Err(PkiError::invalid(
            origin,
            "its PKCS#8 v1 form holds another public key",
        ));
    }
    Ok(reloaded)
}

/// A fresh Ed25519 key that serializes as PKCS#8 v1.
pub(crate) fn generate_ed25519(action: &'static str) -> Result<KeyPair, PkiError> {
    let key = KeyPair::generate_for(&PKCS_ED25519).map_err(PkiError::crypto(action))?;
    to_pkcs8_v1(&key)
}

/// A fresh Ed25519 key: its private key as PKCS#8 v1 PEM
/// (`-----BEGIN PRIVATE KEY-----`, readable by OpenSSL, BoringSSL, Go and
/// rustls alike), and its 32 public bytes.
pub fn generate_ed25519_key() -> Result<(String, [u8; 32]), PkiError> {
    let key = generate_ed25519("generate an Ed25519 key")?;
    let public = <[u8; 32]>::try_from(key.public_key_raw()).map_err(|_| {
        PkiError::invalid(
            "generated Ed25519 key",
            "the public key is not 32 bytes long",
        )
    })?;
    Ok((key.serialize_pem(), public))
}

/// The private key in `key_pem` as PKCS#8 v1 PEM when it is an Ed25519
/// key in *ring*'s PKCS#8 v2 form (what earlier versions wrote); `None`
/// when it is anything else (already v1, another type of key). An error
/// when `key_pem` is no usable private key; `origin` names it.
pub(crate) fn ed25519_key_pem_v1(origin: &str, key_pem: &str) -> Result<Option<String>, PkiError> {
    let key = KeyPair::from_pem(key_pem)
        .map_err(|e| PkiError::invalid(origin, format!("not a usable private key: {e}")))?;
    if !is_ed25519_pkcs8_v2(&key.serialize_der()) {
        return Ok(None);
    }
    Ok(Some(to_pkcs8_v1(&key)?.serialize_pem()))
}

/// Rewrites the key file at `path` as PKCS#8 v1 (atomically, durably,
/// mode 0600) when it holds an Ed25519 key in *ring*'s PKCS#8 v2 form; the
/// key itself is unchanged. Whether it was rewritten; a missing file is
/// left alone (`false`).
pub fn upgrade_key_file(path: &Path) -> Result<bool, PkiError> {
    if !path.exists() {
        return Ok(false);
    }
    let pem = files::read_private(path)?;
    // Anything but a v2 Ed25519 key is left as it is, for its reader to
    // judge (rustls also reads SEC1 and PKCS#1 keys, which rcgen does not).
    let Ok(PrivateKeyDer::Pkcs8(der)) = PrivateKeyDer::from_pem_slice(pem.as_bytes()) else {
        return Ok(false);
    };
    if !is_ed25519_pkcs8_v2(der.secret_pkcs8_der()) {
        return Ok(false);
    }
    match ed25519_key_pem_v1(&path.display().to_string(), &pem)? {
        None => Ok(false),
        Some(v1) => {
            files::write_atomic(path, v1.as_bytes(), files::PRIVATE_MODE)?;
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der_of(pem: &str) -> Vec<u8> {
        match PrivateKeyDer::from_pem_slice(pem.as_bytes()).expect("PEM key") {
            PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
            other => panic!("not PKCS#8: {other:?}"),
        }
    }

    #[test]
    fn generated_keys_are_pkcs8_v1_with_the_public_key_they_claim() {
        let (pem, public) = generate_ed25519_key().expect("key");
        let der = der_of(&pem);
        assert_eq!(der.len(), 48, "v1: 16-byte prefix and the 32-byte seed");
        assert_eq!(der[..16], V1_PREFIX);
        // The version INTEGER is 0 (v1), not 1 (v2).
        assert_eq!(der[2..5], [0x02, 0x01, 0x00]);
        let reloaded = KeyPair::from_pem(&pem).expect("rcgen reads v1");
        assert_eq!(reloaded.public_key_raw(), public);
        let key = crate::provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(der.into()))
            .expect("rustls reads v1");
        assert_eq!(key.algorithm(), rustls::SignatureAlgorithm::ED25519);
    }

    #[test]
    fn ring_v2_keys_convert_to_the_same_key() {
        let v2 = KeyPair::generate_for(&PKCS_ED25519).expect("key");
        assert!(is_ed25519_pkcs8_v2(&v2.serialize_der()), "ring writes v2");
        let v1 = to_pkcs8_v1(&v2).expect("convert");
        assert!(!is_ed25519_pkcs8_v2(&v1.serialize_der()));
        assert_eq!(v1.serialize_der().len(), 48);
        assert_eq!(v1.public_key_raw(), v2.public_key_raw());
        let message = b"same key";
        use rcgen::SigningKey;
        assert_eq!(
            v1.sign(message).expect("sign"),
            v2.sign(message).expect("sign")
        );
    }

    #[test]
    fn v2_pem_converts_and_v1_pem_is_left_alone() {
        let v2 = KeyPair::generate_for(&PKCS_ED25519).expect("key");
        let v1_pem = ed25519_key_pem_v1("test key", &v2.serialize_pem())
            .expect("usable")
            .expect("v2 converts");
        assert_eq!(der_of(&v1_pem)[..16], V1_PREFIX);
        assert_eq!(
            KeyPair::from_pem(&v1_pem).expect("v1").public_key_raw(),
            v2.public_key_raw()
        );
        assert_eq!(
            ed25519_key_pem_v1("test key", &v1_pem).expect("usable"),
            None
        );
        let p256 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        assert_eq!(
            ed25519_key_pem_v1("test key", &p256.serialize_pem()).expect("usable"),
            None
        );
        let err = ed25519_key_pem_v1("test key", "garbage").expect_err("garbage refused");
        assert!(err.to_string().starts_with("test key: "), "{err}");
    }

    #[test]
    fn only_v2_key_files_are_rewritten() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("key.pem");
        assert!(!upgrade_key_file(&path).expect("missing is fine"));
        let v2 = KeyPair::generate_for(&PKCS_ED25519).expect("key");
        std::fs::write(&path, v2.serialize_pem()).expect("write");
        assert!(upgrade_key_file(&path).expect("upgrade"));
        let pem = std::fs::read_to_string(&path).expect("read");
        assert_eq!(der_of(&pem)[..16], V1_PREFIX);
        assert!(!upgrade_key_file(&path).expect("v1 stays"));
        // A SEC1 EC key (the ECPrivateKey inside ring's P-256 PKCS#8),
        // which rustls reads and rcgen does not, is left alone.
        let p256 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let ec_private_key = &p256.serialize_der()[29..];
        assert_eq!(ec_private_key[..2], [0x30, 0x6b]);
        let sec1 = pem::encode_config(
            &pem::Pem::new("EC PRIVATE KEY", ec_private_key),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        );
        assert!(matches!(
            PrivateKeyDer::from_pem_slice(sec1.as_bytes()),
            Ok(PrivateKeyDer::Sec1(_))
        ));
        assert!(KeyPair::from_pem(&sec1).is_err(), "rcgen refuses SEC1");
        std::fs::write(&path, &sec1).expect("write");
        assert!(!upgrade_key_file(&path).expect("left alone"));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), sec1);
    }

    #[test]
    fn other_documents_are_not_converted() {
        let p256 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        assert_eq!(ed25519_pkcs8_v1(&p256.serialize_der()), None);
        assert!(to_pkcs8_v1(&p256).is_err());
        let v2 = KeyPair::generate_for(&PKCS_ED25519)
            .expect("key")
            .serialize_der();
        // Truncated, or with the public key's tag altered.
        assert_eq!(ed25519_pkcs8_v1(&v2[..v2.len() - 1]), None);
        let mut altered = v2.clone();
        altered[48] = 0xa1;
        assert_eq!(ed25519_pkcs8_v1(&altered), None);
        assert_eq!(ed25519_pkcs8_v1(&[]), None);
    }
}
