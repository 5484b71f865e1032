//! TLS to PostgreSQL, with libpq's meaning of `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` in a `postgres://` URL.
//!
//! tokio-postgres knows only `sslmode` disable, prefer and require, and refuses the
//! other parameters, so they are read here and taken out of the URL before it sees it.
//! OpenSSL does the handshake, as it does for libpq, so the same PEM files work with
//! `psql` and with the services.
//!
//! - `disable`: plain connections.
//! - `prefer` (the default): TLS if the server offers it, else plain.
//! - `require`: TLS, the certificate unchecked; unless `sslrootcert` is given, when the
//!   chain is verified against it, as libpq does.
//! - `verify-ca`: TLS, the chain verified against `sslrootcert`.
//! - `verify-full`: as `verify-ca`, and the certificate must name the host connected to.
//!
//! Without `sslrootcert`, or with `sslrootcert=system`, verify-ca and verify-full trust
//! the system's certificate store (libpq would read `~/.postgresql/root.crt`, which a
//! service's container does not have). libpq's rule that `sslrootcert=system` allows
//! only verify-full is kept.

use std::path::{Path, PathBuf};

use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use openssl::x509::X509;
use openssl::x509::store::X509StoreBuilder;
use postgres_openssl::MakeTlsConnector;
use tokio_postgres::config::SslMode as WireMode;

/// What a URL's `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Result<Self, TlsError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's "allow" tries plain first: tokio-postgres cannot.
            "allow" => return Err(TlsError::Allow),
            other => return Err(TlsError::UnknownMode(other.to_owned())),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to ask the server for TLS and insist on it.
    fn wire(self) -> WireMode {
        match self {
            SslMode::Disable => WireMode::Disable,
            SslMode::Prefer => WireMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
        }
    }
}

/// A setting of DATABASE_URL that cannot work: refused at start-up, never waited out.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "DATABASE_URL's sslmode \"{0}\" is unknown: use disable, prefer, require, verify-ca or verify-full"
    )]
    UnknownMode(String),
    #[error("DATABASE_URL's sslmode \"allow\" is not supported: use prefer or disable")]
    Allow,
    #[error("DATABASE_URL's sslrootcert=system needs sslmode=verify-full, not {0}")]
    WeakSystemRoots(&'static str),
    #[error("DATABASE_URL's {0} needs {1} too")]
    Unpaired(&'static str, &'static str),
    #[error("DATABASE_URL's {setting} {} cannot be used: {cause}", path.display())]
    File {
        setting: &'static str,
        path: PathBuf,
        cause: String,
    },
    #[error("cannot set up TLS: {0}")]
    OpenSsl(#[from] openssl::error::ErrorStack),
}

/// Which certificates a verified chain may end at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    System,
    File(PathBuf),
}

/// The TLS parameters a URL gave, as libpq reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub mode: SslMode,
    /// `None`: the chain is not verified.
    pub roots: Option<Roots>,
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The URL's TLS parameters, and the URL without those tokio-postgres refuses.
#[derive(Debug, Default)]
pub struct Parameters {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
}

/// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of a `postgres://` URL's
/// query. A key/value connection string is returned as it is, for tokio-postgres to
/// read its `sslmode`.
pub fn take_parameters(url: &str) -> (String, Parameters) {
    let mut taken = Parameters::default();
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return (url.to_owned(), taken);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match percent_decode(key).as_str() {
            "sslmode" => &mut taken.sslmode,
            "sslrootcert" => &mut taken.sslrootcert,
            "sslcert" => &mut taken.sslcert,
            "sslkey" => &mut taken.sslkey,
            _ => {
                kept.push(pair);
                continue;
            }
        };
        *slot = Some(percent_decode(value));
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, taken)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = text
            .get(i + 1..i + 3)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Settings {
    /// `default_mode`: what tokio-postgres read when the URL named no `sslmode` of its
    /// own (a key/value connection string).
    pub fn from_parameters(
        parameters: Parameters,
        default_mode: SslMode,
    ) -> Result<Settings, TlsError> {
        let mode = match &parameters.sslmode {
            Some(mode) => SslMode::parse(mode)?,
            None => default_mode,
        };
        let roots = match parameters.sslrootcert.as_deref() {
            Some("system") if mode != SslMode::VerifyFull => {
                return Err(TlsError::WeakSystemRoots(mode.as_str()));
            }
            Some("system") => Some(Roots::System),
            Some(path) => Some(Roots::File(PathBuf::from(path))),
            None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => Some(Roots::System),
            None => None,
        };
        let client = match (parameters.sslcert, parameters.sslkey) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (Some(_), None) => return Err(TlsError::Unpaired("sslcert", "sslkey")),
            (None, Some(_)) => return Err(TlsError::Unpaired("sslkey", "sslcert")),
            (None, None) => None,
        };
        Ok(Settings {
            mode,
            roots: roots.filter(|_| mode != SslMode::Disable),
            client,
        })
    }

    pub fn wire_mode(&self) -> WireMode {
        self.mode.wire()
    }

    /// What an operator checks when the handshake is refused.
    pub fn describe(&self) -> String {
        match &self.roots {
            Some(Roots::File(path)) => format!(
                "DATABASE_URL's sslmode={}, sslrootcert={}",
                self.mode.as_str(),
                path.display()
            ),
            Some(Roots::System) => format!(
                "DATABASE_URL's sslmode={}, sslrootcert not given: the system's certificates",
                self.mode.as_str()
            ),
            None => format!("DATABASE_URL's sslmode={}", self.mode.as_str()),
        }
    }

    /// The connector for these settings; the files are read now, so that one that
    /// cannot be read stops the service at start-up.
    pub fn connector(&self) -> Result<MakeTlsConnector, TlsError> {
        let mut builder = SslConnector::builder(SslMethod::tls_client())?;
        match &self.roots {
            None => builder.set_verify(SslVerifyMode::NONE),
            // The builder starts with the system's store already.
            Some(Roots::System) => builder.set_verify(SslVerifyMode::PEER),
            Some(Roots::File(path)) => {
                // Only the file's certificates: libpq does not add the system's to them.
                let mut store = X509StoreBuilder::new()?;
                for cert in read_certificates("sslrootcert", path)? {
                    store.add_cert(cert)?;
                }
                builder.set_cert_store(store.build());
                builder.set_verify(SslVerifyMode::PEER);
            }
        }
        if let Some((cert, key)) = &self.client {
            builder
                .set_certificate_chain_file(cert)
                .map_err(|error| file_error("sslcert", cert, &error))?;
            builder
                .set_private_key_file(key, SslFiletype::PEM)
                .map_err(|error| file_error("sslkey", key, &error))?;
            builder
                .check_private_key()
                .map_err(|error| file_error("sslkey", key, &error))?;
        }
        let check_host = self.mode == SslMode::VerifyFull;
        let mut connector = MakeTlsConnector::new(builder.build());
        connector.set_callback(move |config, _| {
            config.set_verify_hostname(check_host);
            Ok(())
        });
        Ok(connector)
    }
}

fn read_certificates(setting: &'static str, path: &Path) -> Result<Vec<X509>, TlsError> {
    let pem = std::fs::read(path).map_err(|error| file_error(setting, path, &error))?;
    let certs = X509::stack_from_pem(&pem).map_err(|error| file_error(setting, path, &error))?;
    if certs.is_empty() {
        return Err(file_error(setting, path, &"no PEM certificate in it"));
    }
    Ok(certs)
}

fn file_error(setting: &'static str, path: &Path, cause: &dyn std::fmt::Display) -> TlsError {
    TlsError::File {
        setting,
        path: path.to_owned(),
        cause: cause.to_string(),
    }
}

/// Why a TLS handshake was refused, if `error` is one: a certificate not trusted, a
/// host name it does not hold, a server without TLS under a mode that needs it. Such a
/// refusal recurs at every attempt until a setting changes, unlike a connection broken
/// mid-handshake, which is `None` here.
pub fn refusal(error: &tokio_postgres::Error) -> Option<String> {
    let mut previous: Option<&(dyn std::error::Error + 'static)> = None;
    let mut cause = std::error::Error::source(error);
    while let Some(current) = cause {
        if let Some(ssl) = current.downcast_ref::<openssl::ssl::Error>() {
            let stack = ssl.ssl_error()?;
            // postgres-openssl's error reads "<OpenSSL's error>: <verification result>".
            let verdict = previous.map(ToString::to_string).and_then(|text| {
                text.strip_prefix(&format!("{ssl}: "))
                    .map(ToOwned::to_owned)
            });
            let reason = stack
                .errors()
                .first()
                .and_then(openssl::error::Error::reason)
                .unwrap_or("TLS handshake failed");
            return Some(match verdict {
                Some(verdict) => format!("{reason} ({verdict})"),
                None => reason.to_owned(),
            });
        }
        if current.to_string() == "server does not support TLS" {
            return Some(current.to_string());
        }
        previous = Some(current);
        cause = current.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> Result<(String, Settings), TlsError> {
        let (rest, parameters) = take_parameters(url);
        Ok((
            rest,
            Settings::from_parameters(parameters, SslMode::Prefer)?,
        ))
    }

    #[test]
    fn each_mode_is_read_with_its_verification() {
        let cases = [
            ("disable", SslMode::Disable, None, WireMode::Disable),
            ("prefer", SslMode::Prefer, None, WireMode::Prefer),
            ("require", SslMode::Require, None, WireMode::Require),
            (
                "verify-ca",
                SslMode::VerifyCa,
                Some(Roots::System),
                WireMode::Require,
            ),
            (
                "verify-full",
                SslMode::VerifyFull,
                Some(Roots::System),
                WireMode::Require,
            ),
        ];
        for (name, mode, roots, wire) in cases {
            let (_, read) = settings(&format!("postgres://u@h/db?sslmode={name}")).unwrap();
            assert_eq!((read.mode, read.roots.clone()), (mode, roots), "{name}");
            assert_eq!(read.wire_mode(), wire, "{name}");
            assert_eq!(mode.as_str(), name);
        }
    }

    #[test]
    fn no_sslmode_is_prefer_without_verification() {
        let (rest, read) = settings("postgres://u:p@h:5432/db").unwrap();
        assert_eq!(rest, "postgres://u:p@h:5432/db");
        assert_eq!((read.mode, read.roots), (SslMode::Prefer, None));
    }

    #[test]
    fn an_unknown_sslmode_is_refused_by_name() {
        let error = settings("postgres://u@h/db?sslmode=verify_full").unwrap_err();
        assert_eq!(
            error.to_string(),
            "DATABASE_URL's sslmode \"verify_full\" is unknown: use disable, prefer, require, verify-ca or verify-full"
        );
        let error = settings("postgres://u@h/db?sslmode=allow").unwrap_err();
        assert_eq!(
            error.to_string(),
            "DATABASE_URL's sslmode \"allow\" is not supported: use prefer or disable"
        );
    }

    #[test]
    fn sslrootcert_makes_require_verify_the_chain_and_leaves_the_rest_of_the_url() {
        let (rest, read) = settings(
            "postgres://u@h/db?connect_timeout=3&sslrootcert=%2Ftmp%2Fmy%20ca.crt&sslmode=require&application_name=x",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u@h/db?connect_timeout=3&application_name=x"
        );
        assert_eq!(read.mode, SslMode::Require);
        assert_eq!(read.roots, Some(Roots::File("/tmp/my ca.crt".into())));
    }

    #[test]
    fn system_roots_need_verify_full_as_in_libpq() {
        let error = settings("postgres://u@h/db?sslmode=verify-ca&sslrootcert=system").unwrap_err();
        assert_eq!(
            error.to_string(),
            "DATABASE_URL's sslrootcert=system needs sslmode=verify-full, not verify-ca"
        );
        let (_, read) =
            settings("postgres://u@h/db?sslmode=verify-full&sslrootcert=system").unwrap();
        assert_eq!(read.roots, Some(Roots::System));
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let error = settings("postgres://u@h/db?sslcert=/c.crt").unwrap_err();
        assert_eq!(error.to_string(), "DATABASE_URL's sslcert needs sslkey too");
    }

    #[test]
    fn an_unreadable_sslrootcert_is_refused_when_the_connector_is_built() {
        let (_, read) =
            settings("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt")
                .unwrap();
        let Err(error) = read.connector() else {
            panic!("a missing file is refused");
        };
        assert_eq!(
            error.to_string(),
            "DATABASE_URL's sslrootcert /nonexistent/ca.crt cannot be used: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_key_value_string_is_left_to_tokio_postgres() {
        let (rest, parameters) = take_parameters("host=h user=u sslmode=require");
        assert_eq!(rest, "host=h user=u sslmode=require");
        assert!(parameters.sslmode.is_none());
    }
}
