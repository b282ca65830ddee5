//! The shared test vectors (schemas/vectors/, README there): this crate decodes every file to
//! the manifest's `decoded` and encodes `decoded` back: byte for byte for tickets and the JSON a
//! plugin writes, as the same values for JSON the server writes and for Arrow IPC (whose
//! flatbuffers differ between Arrow implementations).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, TimestampSecondArray,
};
use arrow_flight::FlightData;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use bytes::Bytes;
use flight_serve_client::plugin::{hello_message, schema_from_b64, seq_metadata};
use flight_serve_client::proto::{self, ticket::Kind};
use flight_serve_client::PutAck;
use prost::Message;
use serde_json::{json, Map, Value};

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas/vectors")
}

fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(vectors_dir().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(manifest["version"], json!(1));
    manifest["vectors"].as_array().unwrap().clone()
}

fn of_kind(kind: &str) -> Vec<(Value, Vec<u8>)> {
    let out: Vec<_> = manifest()
        .into_iter()
        .filter(|e| e["kind"] == json!(kind))
        .map(|e| {
            let data = std::fs::read(vectors_dir().join(e["file"].as_str().unwrap())).unwrap();
            (e, data)
        })
        .collect();
    assert!(!out.is_empty(), "no {kind} vectors");
    out
}

// --- tickets: protobuf JSON form (MessageToDict: uint64 as strings, defaults left out) --------

fn put_str(map: &mut Map<String, Value>, key: &str, value: &str) {
    if !value.is_empty() {
        map.insert(key.into(), json!(value));
    }
}

fn put_u64(map: &mut Map<String, Value>, key: &str, value: u64) {
    if value != 0 {
        map.insert(key.into(), json!(value.to_string()));
    }
}

fn ticket_json(ticket: &proto::Ticket) -> Value {
    let mut out = Map::new();
    if ticket.version != 0 {
        out.insert("version".into(), json!(ticket.version));
    }
    let mut inner = Map::new();
    let key = match ticket.kind.as_ref().expect("a ticket kind") {
        Kind::Query(q) => {
            put_str(&mut inner, "sql", &q.sql);
            if !q.streams.is_empty() {
                let pins: Vec<Value> = q
                    .streams
                    .iter()
                    .map(|p| {
                        let mut m = Map::new();
                        put_str(&mut m, "stream", &p.stream);
                        put_str(&mut m, "incarnation", &p.incarnation);
                        put_u64(&mut m, "stop_offset", p.stop_offset);
                        Value::Object(m)
                    })
                    .collect();
                inner.insert("streams".into(), Value::Array(pins));
            }
            "query"
        }
        Kind::StreamRange(r) => {
            put_str(&mut inner, "stream", &r.stream);
            put_str(&mut inner, "incarnation", &r.incarnation);
            put_u64(&mut inner, "start_offset", r.start_offset);
            put_u64(&mut inner, "stop_offset", r.stop_offset);
            "stream_range"
        }
        Kind::Tail(t) => {
            put_str(&mut inner, "stream", &t.stream);
            put_str(&mut inner, "incarnation", &t.incarnation);
            put_u64(&mut inner, "start_offset", t.start_offset);
            "tail"
        }
    };
    out.insert(key.into(), Value::Object(inner));
    Value::Object(out)
}

fn s(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_str)
        .map(|x| x.parse().unwrap())
        .unwrap_or(0)
}

fn ticket_from_json(v: &Value) -> proto::Ticket {
    let kind = if let Some(q) = v.get("query") {
        Kind::Query(proto::QueryTicket {
            sql: s(q, "sql"),
            streams: q
                .get("streams")
                .and_then(Value::as_array)
                .map(|pins| {
                    pins.iter()
                        .map(|p| proto::StreamPin {
                            stream: s(p, "stream"),
                            incarnation: s(p, "incarnation"),
                            stop_offset: u(p, "stop_offset"),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
    } else if let Some(r) = v.get("stream_range") {
        Kind::StreamRange(proto::StreamRangeTicket {
            stream: s(r, "stream"),
            incarnation: s(r, "incarnation"),
            start_offset: u(r, "start_offset"),
            stop_offset: u(r, "stop_offset"),
        })
    } else {
        let t = &v["tail"];
        Kind::Tail(proto::TailTicket {
            stream: s(t, "stream"),
            incarnation: s(t, "incarnation"),
            start_offset: u(t, "start_offset"),
        })
    };
    proto::Ticket {
        version: v["version"].as_u64().unwrap() as u32,
        kind: Some(kind),
    }
}

#[test]
fn tickets_decode_and_encode_byte_for_byte() {
    for (entry, data) in of_kind("ticket") {
        let ticket = proto::Ticket::decode(data.as_slice()).unwrap();
        assert_eq!(ticket_json(&ticket), entry["decoded"], "{}", entry["name"]);
        assert_eq!(
            ticket_from_json(&entry["decoded"]).encode_to_vec(),
            data,
            "{}",
            entry["name"]
        );
    }
}

#[test]
fn the_max_offset_tail_ticket_spelled_out() {
    let (_, data) = of_kind("ticket")
        .into_iter()
        .find(|(e, _)| e["name"] == json!("ticket_tail_max_offset"))
        .unwrap();
    assert_eq!(
        proto::Ticket::decode(data.as_slice()).unwrap(),
        proto::Ticket::tail("e", "6fa459ea-ee8a-3ca4-894e-db77e160355e", i64::MAX as u64)
    );
}

// --- schemas and values as text ---------------------------------------------------------------

fn type_text(t: &DataType) -> String {
    match t {
        DataType::Utf8 => "string".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::Float64 => "double".into(),
        DataType::Timestamp(TimeUnit::Second, None) => "timestamp[s]".into(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) => format!("timestamp[us, tz={tz}]"),
        other => panic!("a type the vectors do not use: {other}"),
    }
}

fn text_type(t: &str) -> DataType {
    match t {
        "string" => DataType::Utf8,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "double" => DataType::Float64,
        "timestamp[s]" => DataType::Timestamp(TimeUnit::Second, None),
        "timestamp[us, tz=UTC]" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        other => panic!("a type the vectors do not use: {other}"),
    }
}

fn schema_text(schema: &Schema) -> Value {
    Value::Array(
        schema
            .fields()
            .iter()
            .map(|f| json!({"name": f.name(), "type": type_text(f.data_type()), "nullable": f.is_nullable()}))
            .collect(),
    )
}

fn schema_of(text: &Value) -> Schema {
    Schema::new(
        text.as_array()
            .unwrap()
            .iter()
            .map(|f| {
                Field::new(
                    f["name"].as_str().unwrap(),
                    text_type(f["type"].as_str().unwrap()),
                    f["nullable"].as_bool().unwrap(),
                )
            })
            .collect::<Vec<_>>(),
    )
}

fn values(column: &ArrayRef) -> Value {
    let n = column.len();
    let cell = |i: usize, v: Value| if column.is_null(i) { Value::Null } else { v };
    Value::Array(
        (0..n)
            .map(|i| match column.data_type() {
                DataType::Utf8 => cell(i, json!(column.as_string::<i32>().value(i))),
                DataType::Int32 => cell(i, json!(column.as_primitive::<Int32Type>().value(i))),
                DataType::Int64 => cell(i, json!(column.as_primitive::<Int64Type>().value(i))),
                DataType::Float64 => cell(i, json!(column.as_primitive::<Float64Type>().value(i))),
                DataType::Timestamp(TimeUnit::Second, _) => cell(
                    i,
                    json!(column
                        .as_any()
                        .downcast_ref::<TimestampSecondArray>()
                        .unwrap()
                        .value(i)),
                ),
                DataType::Timestamp(TimeUnit::Microsecond, _) => cell(
                    i,
                    json!(column
                        .as_any()
                        .downcast_ref::<TimestampMicrosecondArray>()
                        .unwrap()
                        .value(i)),
                ),
                other => panic!("a type the vectors do not use: {other}"),
            })
            .collect(),
    )
}

fn column_of(field: &Field, values: &Value) -> ArrayRef {
    let items = values.as_array().unwrap();
    let ints = || items.iter().map(Value::as_i64).collect::<Vec<_>>();
    match field.data_type() {
        DataType::Utf8 => Arc::new(items.iter().map(Value::as_str).collect::<StringArray>()),
        DataType::Int32 => Arc::new(
            items
                .iter()
                .map(|v| v.as_i64().map(|x| x as i32))
                .collect::<Int32Array>(),
        ),
        DataType::Int64 => Arc::new(ints().into_iter().collect::<Int64Array>()),
        DataType::Float64 => Arc::new(items.iter().map(Value::as_f64).collect::<Float64Array>()),
        DataType::Timestamp(TimeUnit::Second, None) => Arc::new(TimestampSecondArray::from(ints())),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            Arc::new(TimestampMicrosecondArray::from(ints()).with_timezone_opt(tz.clone()))
        }
        other => panic!("a type the vectors do not use: {other}"),
    }
}

fn batch_of(decoded: &Value) -> RecordBatch {
    let schema = Arc::new(schema_of(&decoded["schema"]));
    let columns = schema
        .fields()
        .iter()
        .map(|f| column_of(f, &decoded["columns"][f.name()]))
        .collect();
    RecordBatch::try_new(schema, columns).unwrap()
}

// --- plugin hello -----------------------------------------------------------------------------

fn hello_decoded(data: &[u8]) -> Value {
    let mut hello: Value = serde_json::from_slice(data).unwrap();
    for key in ["input_schema", "output_schema"] {
        let schema = schema_from_b64(hello[key].as_str().unwrap(), key).unwrap();
        hello[key] = schema_text(&schema);
    }
    hello
}

#[test]
fn plugin_hellos_decode_and_encode_to_the_same_declaration() {
    for (entry, data) in of_kind("plugin_hello") {
        let decoded = &entry["decoded"];
        assert_eq!(hello_decoded(&data), *decoded, "{}", entry["name"]);
        let again = hello_message(
            decoded["name"].as_str().unwrap(),
            &schema_of(&decoded["input_schema"]),
            &schema_of(&decoded["output_schema"]),
            decoded["max_in_flight"].as_u64().unwrap() as u32,
        )
        .unwrap();
        assert_eq!(hello_decoded(&again), *decoded, "{}", entry["name"]);
    }
}

// --- plugin frames: length-delimited FlightData -----------------------------------------------

fn read_frames(mut data: &[u8]) -> Vec<FlightData> {
    let mut out = Vec::new();
    while !data.is_empty() {
        out.push(FlightData::decode_length_delimited(&mut data).unwrap());
    }
    out
}

fn write_frames(frames: &[FlightData]) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        frame.encode_length_delimited(&mut out).unwrap();
    }
    out
}

fn frame_decoded(direction: &str, frames: &[FlightData]) -> Value {
    let last = frames.last().unwrap();
    let mut out = json!({
        "direction": direction,
        "app_metadata": serde_json::from_slice::<Value>(&last.app_metadata).unwrap(),
    });
    if frames.len() == 2 {
        let schema = Arc::new(Schema::try_from(&frames[0]).unwrap());
        let batch =
            arrow_flight::utils::flight_data_to_arrow_batch(&frames[1], schema.clone(), &HashMap::new())
                .unwrap();
        out["schema"] = schema_text(&schema);
        out["num_rows"] = json!(batch.num_rows());
        let mut columns = Map::new();
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            columns.insert(field.name().clone(), values(column));
        }
        out["columns"] = Value::Object(columns);
    } else {
        assert_eq!(frames.len(), 1);
        assert!(last.data_header.is_empty() && last.data_body.is_empty());
    }
    out
}

#[test]
fn plugin_frames_decode_and_encode() {
    for (entry, data) in of_kind("plugin_frame") {
        let decoded = &entry["decoded"];
        let direction = decoded["direction"].as_str().unwrap();
        let frames = read_frames(&data);
        assert_eq!(frame_decoded(direction, &frames), *decoded, "{}", entry["name"]);
        // what this crate writes for `decoded`
        let metadata: Bytes = match decoded["app_metadata"].get("seq") {
            Some(seq) => seq_metadata(seq.as_i64().unwrap()), // as the Rust plugin tags results
            None => serde_json::to_vec(&decoded["app_metadata"]).unwrap().into(),
        };
        if direction == "plugin_to_server" {
            assert_eq!(
                metadata,
                frames.last().unwrap().app_metadata,
                "{}: byte for byte",
                entry["name"]
            );
        }
        let written = if decoded.get("schema").is_some() {
            let batch = batch_of(decoded);
            let mut messages =
                arrow_flight::utils::batches_to_flight_data(batch.schema().as_ref(), [&batch]).unwrap();
            messages.last_mut().unwrap().app_metadata = metadata;
            write_frames(&messages)
        } else {
            write_frames(&[FlightData {
                app_metadata: metadata,
                ..Default::default()
            }])
        };
        assert_eq!(
            frame_decoded(direction, &read_frames(&written)),
            *decoded,
            "{}: re-encoded",
            entry["name"]
        );
    }
}

// --- PutResult metadata -----------------------------------------------------------------------

#[test]
fn put_results_decode() {
    for (entry, data) in of_kind("put_result_metadata") {
        let decoded = &entry["decoded"];
        match PutAck::decode(&data) {
            Ok(ack) => {
                let mut back = json!({"offset": ack.offset, "rows": ack.rows});
                if let Some(w) = ack.watermark_ns {
                    back["watermark_ns"] = json!(w);
                }
                if ack.end_of_input {
                    back["end_of_input"] = json!(true);
                }
                assert_eq!(back, *decoded, "{}", entry["name"]);
            }
            Err(e) => {
                assert_eq!(
                    e.to_string(),
                    format!("protocol: DoPut failed: {}", decoded["error"].as_str().unwrap())
                );
            }
        }
    }
}
