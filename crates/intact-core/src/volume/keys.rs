//! The volume's keys: derivation from the master key (labelled HKDF domains) and the
//! password-wrapped master key of the config.

#[allow(unused_imports)]
use super::*;

pub(super) struct Keys {
    /// Shared with every open file's [`crypto::FileKeys`].
    pub(super) master: Arc<MasterKey>,
    pub(super) hasher: NodeHasher,
    pub(super) leaf: SubKey,
    pub(super) ctrs: SubKey,
    pub(super) anchor: SubKey,
    pub(super) journal: SubKey,
    pub(super) log: SubKey,
    /// Order keys of directory entries ([`super::dirtree::name_key`]).
    pub(super) names: SubKey,
}

pub(super) fn derive_keys(master: &MasterKey) -> Keys {
    let node = master.derive(label::NODE, &[]);
    Keys {
        master: Arc::new(master.clone()),
        hasher: NodeHasher::new(*node.expose_secret()),
        leaf: master.derive(label::LEAF, &[]),
        ctrs: master.derive(label::COUNTERS, &[]),
        anchor: master.derive(label::ANCHOR, &[]),
        journal: master.derive(label::JOURNAL, &[]),
        log: master.derive(label::LOG, &[]),
        names: master.derive(label::DIR_NAME, &[]),
    }
}

pub(crate) fn wrap_key(master: &MasterKey, kek: &SubKey, aad: &[u8]) -> String {
    let mut nonce = [0u8; crypto::NONCE_LEN];
    crypto::fill_random(&mut nonce);
    let mut buf = master.expose_secret().to_vec();
    crypto::Gcm::new(kek).seal_append(nonce, aad, &mut buf);
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    let h = hex::encode(&out);
    zeroize::Zeroize::zeroize(&mut buf);
    h
}

pub(super) fn unwrap_key(config: &Config, password: &[u8]) -> Result<MasterKey> {
    unwrap_envelope(
        &config.wrapped_key,
        &config.salt,
        config.kdf,
        &config.aad(),
        password,
    )
}

/// Opens a password-wrapped master key ([`wrap_key`]'s hex envelope) whose associated data
/// is `aad` (the fields of the config it belongs to, so none can be changed).
pub(crate) fn unwrap_envelope(
    wrapped_hex: &str,
    salt_hex: &str,
    kdf: crypto::KdfParams,
    aad: &[u8],
    password: &[u8],
) -> Result<MasterKey> {
    let salt = hex::decode(salt_hex).map_err(|_| Error::Config("bad salt".into()))?;
    let kek = crypto::password_key(password, &salt, kdf)?;
    let mut env = zeroize::Zeroizing::new(
        hex::decode(wrapped_hex).map_err(|_| Error::Config("bad wrapped key".into()))?,
    );
    if env.len() != crypto::NONCE_LEN + 32 + crypto::TAG_LEN {
        return Err(Error::Config("wrapped key has the wrong length".into()));
    }
    let nonce: [u8; crypto::NONCE_LEN] = env[..crypto::NONCE_LEN].try_into().expect("12");
    let n = crypto::Gcm::new(&kek)
        .open_in_place(nonce, aad, &mut env[crypto::NONCE_LEN..])
        .ok_or(Error::WrongPassword)?;
    debug_assert_eq!(n, 32);
    let mut k = [0u8; 32];
    k.copy_from_slice(&env[crypto::NONCE_LEN..crypto::NONCE_LEN + 32]);
    Ok(MasterKey::from_bytes(k))
}
