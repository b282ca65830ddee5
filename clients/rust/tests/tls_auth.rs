//! TLS, bearer tokens and the Basic handshake against a real flight-serve started with
//! `--tls-cert/--tls-key/--tls-client-ca` (mutual TLS), `--tokens-file` and `--users-file`, as
//! tests/integration/test_client_auth_tls.py checks the Python client. The certificates are a
//! throw-away CA and a server and client certificate signed by it (valid for 127.0.0.1), made
//! here with the openssl command line as tests/integration/conftest.py's `pki` fixture makes
//! them.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use common::{wait_until, Proc, Server};
use flight_serve_client::{Client, ConnectOptions, Error};

const TOKEN_RW: &str = "tok-rust-rw";
const TOKEN_READ: &str = "tok-rust-read";
const TOKEN_ADMIN: &str = "tok-rust-admin";

/// The test PKI in `dir` (`ca.pem`, `server.pem`/`.key`, `client.pem`/`.key`); `false` when
/// there is no openssl command line.
fn make_pki(dir: &Path) -> bool {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output();
        match out {
            Ok(out) => assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => panic!("openssl {args:?}: {e}"),
        }
    };
    if Command::new("openssl").arg("version").output().is_err() {
        return false;
    }
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    for name in ["server", "client"] {
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            &format!("{name}.pem"),
        ]);
    }
    true
}

/// A server with mutual TLS, a tokens file and a users file, and its PKI directory.
fn secured() -> Option<(Server, tempfile::TempDir)> {
    let pki = tempfile::tempdir().unwrap();
    if !make_pki(pki.path()) {
        eprintln!("skipped: needs the openssl command line");
        return None;
    }
    let p = |name: &str| pki.path().join(name).to_str().unwrap().to_owned();
    std::fs::write(
        pki.path().join("tokens.txt"),
        format!(
            "{TOKEN_READ} read dashboards\n{TOKEN_RW} read,write ingest\n{TOKEN_ADMIN} read,write,admin ops\n"
        ),
    )
    .unwrap();
    std::fs::write(pki.path().join("users.txt"), "alice:wonderland\n").unwrap();
    let server = Server::start_with(&[
        "--tls-cert",
        &p("server.pem"),
        "--tls-key",
        &p("server.key"),
        "--tls-client-ca",
        &p("ca.pem"),
        "--tokens-file",
        &p("tokens.txt"),
        "--users-file",
        &p("users.txt"),
    ]);
    assert!(
        server.location.starts_with("grpc+tls://127.0.0.1:"),
        "{}",
        server.location
    );
    Some((server, pki))
}

/// CA, client certificate and key: everything this server asks of a client but credentials.
fn mutual_tls(pki: &Path) -> ConnectOptions {
    let read = |name: &str| std::fs::read(pki.join(name)).unwrap();
    ConnectOptions::new()
        .tls_ca_pem(read("ca.pem"))
        .tls_identity_pem(read("client.pem"), read("client.key"))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]))
}

fn rows(values: Vec<i64>) -> impl futures::Stream<Item = Result<RecordBatch, arrow_schema::ArrowError>> {
    let batch = RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(values))]).unwrap();
    futures::stream::iter([Ok(batch)])
}

fn single_i64(batches: &[RecordBatch]) -> i64 {
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
    let batch = batches.iter().find(|b| b.num_rows() == 1).unwrap();
    batch.column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_sent_on_every_call_over_mutual_tls() {
    let Some((server, pki)) = secured() else { return };
    let mut writer = Client::connect_with(&server.location, mutual_tls(pki.path()).token(TOKEN_RW))
        .await
        .unwrap();
    let acks = writer
        .put("tokened", None, schema(), rows(vec![1, 2, 3]), false)
        .await
        .unwrap();
    assert_eq!(
        acks.iter().map(|a| (a.offset, a.rows)).collect::<Vec<_>>(),
        vec![(0, 3)]
    );
    let sum = writer.query("SELECT sum(v) AS s FROM tokened").await.unwrap();
    assert_eq!(single_i64(&sum.batches), 6);
    let sql = writer
        .flight_sql_query("SELECT count(*) AS n FROM tokened")
        .await
        .unwrap();
    assert_eq!(single_i64(&sql.batches), 3);
    let tail = writer.tail("tokened", 0).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![0]);
    // DoExchange goes through the raw service client: the header must be there too
    let exchange_schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new(
            "t",
            DataType::Timestamp(arrow_schema::TimeUnit::Second, Some("UTC".into())),
            true,
        ),
    ]));
    let batch = RecordBatch::try_new(
        exchange_schema.clone(),
        vec![
            Arc::new(arrow_array::StringArray::from(vec!["a", "a", "b"])),
            Arc::new(arrow_array::TimestampSecondArray::from(vec![1, 2, 3]).with_timezone("UTC")),
        ],
    )
    .unwrap();
    let output = writer
        .exchange(
            "CREATE SOURCE ev (WATERMARK FOR t AS t);
             SELECT k, window_start, window_end, count(*) AS n
             FROM TUMBLE(ev, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end",
            exchange_schema,
            vec![batch],
        )
        .await
        .unwrap();
    let mut counts: Vec<(String, i64)> = output
        .results
        .iter()
        .flat_map(|(_, b)| {
            let k = b.column_by_name("k").unwrap().as_string::<i32>().clone();
            let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>().clone();
            (0..b.num_rows()).map(move |i| (k.value(i).to_owned(), n.value(i)))
        })
        .collect();
    counts.sort();
    assert_eq!(counts, vec![("a".to_owned(), 2), ("b".to_owned(), 1)]);
    assert!(
        !format!("{writer:?}").contains(TOKEN_RW),
        "Debug shows the token: {writer:?}"
    );
    // a clone sends the token too
    let mut clone = writer.clone();
    assert_eq!(clone.stream_info("tokened").await.unwrap().total_records, 3);

    let mut reader = Client::connect_with(&server.location, mutual_tls(pki.path()).token(TOKEN_READ))
        .await
        .unwrap();
    assert_eq!(reader.stream_info("tokened").await.unwrap().total_records, 3);
    let refused = reader
        .put("tokened", None, schema(), rows(vec![4]), false)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(tonic::Code::PermissionDenied), "{refused}");
    assert!(refused.to_string().contains("'write' role"), "{refused}");

    for options in [
        mutual_tls(pki.path()).token("not-a-token"),
        mutual_tls(pki.path()),
    ] {
        let mut stranger = Client::connect_with(&server.location, options).await.unwrap();
        let error = stranger.stream_info("tokened").await.unwrap_err();
        assert_eq!(error.code(), Some(tonic::Code::Unauthenticated), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_needs_the_ca_and_the_client_certificate_and_a_user_runs_the_basic_handshake() {
    let Some((server, pki)) = secured() else { return };
    // the system's roots only: the test CA is not among them
    let untrusting = Client::connect_with(&server.location, ConnectOptions::new().token(TOKEN_READ)).await;
    assert!(matches!(untrusting, Err(Error::Transport(_))), "{untrusting:?}");
    // the CA but no client certificate: the server refuses the connection (during the
    // handshake with TLS 1.2, at the first call with TLS 1.3)
    let ca = std::fs::read(pki.path().join("ca.pem")).unwrap();
    let no_certificate = async {
        let options = ConnectOptions::new().tls_ca_pem(ca.clone()).token(TOKEN_READ);
        Client::connect_with(&server.location, options)
            .await?
            .query("SELECT 1 AS one")
            .await
    };
    let refused = no_certificate.await;
    assert!(
        refused.is_err(),
        "a client without a certificate was served: {refused:?}"
    );

    // a user and password: the Basic handshake's bearer token on every later call
    let mut alice = Client::connect_with(
        &server.location,
        mutual_tls(pki.path()).basic_auth("alice", "wonderland"),
    )
    .await
    .unwrap();
    let acks = alice
        .put("alices", None, schema(), rows(vec![5, 7]), false)
        .await
        .unwrap();
    assert_eq!(
        acks.iter().map(|a| (a.offset, a.rows)).collect::<Vec<_>>(),
        vec![(0, 2)]
    );
    let product = alice
        .query("SELECT max(v) * min(v) AS p FROM alices")
        .await
        .unwrap();
    assert_eq!(single_i64(&product.batches), 35);
    let sql = alice
        .flight_sql_query("SELECT sum(v) AS s FROM alices")
        .await
        .unwrap();
    assert_eq!(single_i64(&sql.batches), 12);

    let wrong = Client::connect_with(
        &server.location,
        mutual_tls(pki.path()).basic_auth("alice", "wrong"),
    )
    .await;
    match wrong {
        Err(e) => assert_eq!(e.code(), Some(tonic::Code::Unauthenticated), "{e}"),
        Ok(_) => panic!("a wrong password was accepted"),
    }
}

#[tokio::test]
async fn bad_connect_options_name_the_option() {
    let both = ConnectOptions::new().token("t").basic_auth("u", "p");
    let error = Client::connect_with("grpc+tls://127.0.0.1:1", both)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "options: give either a token or a user and password (basic_auth), not both"
    );
    for (options, name) in [
        (ConnectOptions::new().tls_ca_pem(b"pem".to_vec()), "tls_ca_pem"),
        (
            ConnectOptions::new().tls_identity_pem(b"c".to_vec(), b"k".to_vec()),
            "tls_identity_pem",
        ),
        (
            ConnectOptions::new().override_hostname("localhost"),
            "override_hostname",
        ),
    ] {
        let error = Client::connect_with("grpc://127.0.0.1:1", options)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("options: {name} is for a TLS server, but \"grpc://127.0.0.1:1\" is not grpc+tls://")
        );
    }
    let secret = ConnectOptions::new()
        .basic_auth("u", "pa55word")
        .tls_identity_pem(b"c".to_vec(), b"KEY".to_vec());
    assert_eq!(
        format!("{secret:?}"),
        "ConnectOptions { tls_ca: false, tls_identity: true, override_hostname: None, token: None, basic_auth_user: Some(\"u\") }"
    );
    let error = Client::connect_with("grpc+tls://127.0.0.1:1", ConnectOptions::new().token("a\nb"))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "options: the token is not a valid header value (visible ASCII only)"
    );
}

const DOUBLE: &str = "
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE FUNCTION double() RETURNS TABLE (k VARCHAR, t TIMESTAMP(0), v2 BIGINT)
WITH (connector = 'plugin', timeout = '10s', max_in_flight = '8');
CREATE SINK doubled WITH (connector = 'flight', stream = 'doubled');
INSERT INTO doubled SELECT k, t, v2 FROM double(events);
";

/// `double_plugin` with the token and TLS files from the environment it reads.
fn plugin(server: &Server, pki: &Path, token: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_double_plugin"));
    command
        .arg(&server.location)
        .arg("double")
        .env_remove("FLIGHT_SERVE_TOKEN")
        .env("FLIGHT_SERVE_TLS_CA", pki.join("ca.pem"))
        .env("FLIGHT_SERVE_TLS_CERT", pki.join("client.pem"))
        .env("FLIGHT_SERVE_TLS_KEY", pki.join("client.key"));
    if let Some(token) = token {
        command.env("FLIGHT_SERVE_TOKEN", token);
    }
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_plugin_attaches_over_mutual_tls_with_a_token() {
    let Some((server, pki)) = secured() else { return };
    let refused = plugin(&server, pki.path(), None).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("Unauthenticated"), "{stderr}");
    let reader = plugin(&server, pki.path(), Some(TOKEN_READ)).output().unwrap();
    assert_eq!(reader.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&reader.stderr);
    assert!(
        stderr.contains("PermissionDenied") && stderr.contains("'write' role"),
        "{stderr}"
    );

    let mut attached = Proc::spawn(&mut plugin(&server, pki.path(), Some(TOKEN_RW)));
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            let line = attached.line();
            (attached, line)
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let (attached, line) = line;
    assert!(line.starts_with("attached "), "{line:?}\n{}", server.log());

    let mut admin = Client::connect_with(&server.location, mutual_tls(pki.path()).token(TOKEN_ADMIN))
        .await
        .unwrap();
    let events_schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new(
            "t",
            DataType::Timestamp(arrow_schema::TimeUnit::Second, None),
            true,
        ),
        Field::new("v", DataType::Int64, true),
    ]));
    let v: Vec<i64> = (0..100).collect();
    let batch = RecordBatch::try_new(
        events_schema.clone(),
        vec![
            Arc::new(arrow_array::StringArray::from(
                v.iter().map(|v| format!("k{}", v % 3)).collect::<Vec<_>>(),
            )),
            Arc::new(arrow_array::TimestampSecondArray::from(v.clone())),
            Arc::new(Int64Array::from(v)),
        ],
    )
    .unwrap();
    admin
        .put(
            "events",
            None,
            events_schema,
            futures::stream::iter([Ok(batch)]),
            true,
        )
        .await
        .unwrap();
    admin
        .action(
            "pipeline.submit",
            &serde_json::json!({"sql": DOUBLE, "name": "tlsplugged"}),
        )
        .await
        .unwrap();
    let poll = admin.clone();
    wait_until("100 rows in doubled", Duration::from_secs(60), || {
        let mut c = poll.clone();
        async move { matches!(c.stream_info("doubled").await, Ok(info) if info.total_records >= 100) }
    })
    .await;
    let sum = admin.query("SELECT sum(v2) AS s FROM doubled").await.unwrap();
    assert_eq!(single_i64(&sum.batches), 2 * (0..100i64).sum::<i64>());
    drop(attached);
}
