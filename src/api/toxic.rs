//! Toxics as Toxiproxy's clients send them, decoded the way Go's encoding/json
//! would: unknown keys ignored, `null` as absent, integers where Go has int64, and
//! Go's own error texts when a value does not fit.

use serde_json::{Map, Number, Value};

use super::Error;
use crate::fault::Kind;

/// Go renders a float32 1.0 as `1`: integral toxicities go out as integers.
pub(super) fn go_float(x: f64) -> Number {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        Number::from(x as i64)
    } else {
        Number::from_f64(f64::from(x as f32)).unwrap_or_else(|| Number::from(0))
    }
}

/// A toxic as clients send it. Every field optional; `null` means "leave as is".
pub(super) struct ToxicInput {
    pub(super) name: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) stream: Option<String>,
    pub(super) toxicity: Option<f64>,
    pub(super) scope: Option<String>,
    pub(super) attributes: Option<Map<String, Value>>,
}

impl ToxicInput {
    pub(super) fn from_json(body: &Value) -> Result<ToxicInput, Error> {
        let Value::Object(map) = body else {
            return Err(Error::BadBody(format!(
                "json: cannot unmarshal {} into Go value of type toxiproxy.Toxic",
                json_kind(body)
            )));
        };
        let string = |key: &str| match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Error::BadBody(format!(
                "json: cannot unmarshal {} into Go struct field Toxic.{key} of type string",
                json_kind(other)
            ))),
        };
        let toxicity = match map.get("toxicity") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(other) => {
                return Err(Error::BadBody(format!(
                    "json: cannot unmarshal {} into Go struct field Toxic.toxicity of type float32",
                    json_kind(other)
                )));
            }
        };
        let attributes = match map.get("attributes") {
            None | Some(Value::Null) => None,
            Some(Value::Object(a)) => Some(a.clone()),
            Some(other) => {
                return Err(Error::BadBody(format!(
                    "json: cannot unmarshal {} into Go struct field Toxic.attributes of type map",
                    json_kind(other)
                )));
            }
        };
        Ok(ToxicInput {
            name: string("name")?,
            kind: string("type")?,
            stream: string("stream")?,
            toxicity,
            scope: string("scope")?,
            attributes,
        })
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `base`'s attributes with `changes` written over them, as Go decodes JSON into an
/// existing struct: unknown keys ignored, integers where integers belong (negative
/// ones taken as 0, snag's attributes being unsigned), floats where floats belong.
pub(super) fn merge(base: &Kind, changes: Option<&Map<String, Value>>) -> Result<Kind, Error> {
    let Value::Object(mut attrs) = base.attributes_json() else {
        unreachable!("attributes are always an object")
    };
    for (key, value) in changes.into_iter().flatten() {
        let Some(slot) = attrs.get_mut(key) else {
            continue;
        };
        let go_struct = go_struct_name(base.type_name());
        let go_type = match slot {
            Value::Number(n) if n.is_f64() => "float64",
            Value::Number(_) => "int64",
            Value::String(_) => "string",
            _ => "map[string]string",
        };
        let wrong = |what: &str| {
            Error::BadBody(format!(
                "json: cannot unmarshal {what} into Go struct field {go_struct}.attributes.{key} of type {go_type}"
            ))
        };
        match (go_type, value) {
            (_, Value::Null) => {}
            ("float64", Value::Number(n)) => *slot = Value::Number(n.clone()),
            ("int64", Value::Number(n)) if n.is_i64() || n.is_u64() => {
                *slot = Value::from(
                    n.as_i64()
                        .map_or_else(|| n.as_u64().unwrap_or(0), |i| i.max(0) as u64),
                );
            }
            ("int64", Value::Number(n)) => return Err(wrong(&format!("number {n}"))),
            ("string", Value::String(_)) => *slot = value.clone(),
            ("map[string]string", Value::Object(m)) if m.values().all(Value::is_string) => {
                *slot = value.clone()
            }
            (_, other) => return Err(wrong(json_kind(other))),
        }
    }
    let table: toml::Table = attrs.into_iter().map(|(k, v)| (k, to_toml(v))).collect();
    Kind::lenient(base.type_name(), table).map_err(Error::Invalid)
}

/// JSON attributes as the TOML values the attribute structs deserialise from.
fn to_toml(v: Value) -> toml::Value {
    match v {
        Value::Number(n) if n.is_f64() => toml::Value::Float(n.as_f64().unwrap_or(0.0)),
        Value::Number(n) => {
            toml::Value::Integer(n.as_u64().map_or(0, |u| u.min(i64::MAX as u64) as i64))
        }
        Value::String(s) => toml::Value::String(s),
        Value::Bool(b) => toml::Value::Boolean(b),
        Value::Array(a) => toml::Value::Array(a.into_iter().map(to_toml).collect()),
        Value::Object(m) => {
            toml::Value::Table(m.into_iter().map(|(k, v)| (k, to_toml(v))).collect())
        }
        Value::Null => toml::Value::Table(toml::Table::new()),
    }
}

fn go_struct_name(type_name: &str) -> String {
    let camel: String = type_name
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    format!("{camel}Toxic")
}
