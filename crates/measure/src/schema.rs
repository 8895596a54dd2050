//! The `"schema"` field of pagefold's JSON documents.
//!
//! Every JSON document pagefold writes (a command's `--json` output, a file
//! it leaves behind, a string one of its libraries hands out) is an object
//! whose `"schema"` field names its format and version: `pagefold-FORMAT/N`.
//! N changes when a field changes meaning or goes away; new fields may be
//! added without changing it. Each format's name is a constant beside the
//! code that writes it; [`document`] is the one place that puts it into a
//! document. It lives in this crate because this is the lowest crate every
//! writer can depend on: it depends on no other pagefold crate.

use serde::Serialize;
use serde_json::Value;

/// The name of the field.
pub const FIELD: &str = "schema";

/// `body` as a JSON object with its [`FIELD`] set to `schema` (replacing
/// any it had). A body that is not a JSON object is an error: a document
/// without room for its schema is not one.
pub fn document<T: Serialize + ?Sized>(schema: &str, body: &T) -> serde_json::Result<Value> {
    let mut value = serde_json::to_value(body)?;
    let map = value.as_object_mut().ok_or_else(|| {
        <serde_json::Error as serde::ser::Error>::custom(format_args!(
            "a {schema} document must be a JSON object"
        ))
    })?;
    map.insert(FIELD.into(), schema.into());
    Ok(value)
}

/// [`document`], pretty-printed: what the commands print and write to files.
pub fn pretty<T: Serialize + ?Sized>(schema: &str, body: &T) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&document(schema, body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Body {
        a: u32,
    }

    #[test]
    fn documents_carry_their_schema() {
        let v = document("pagefold-test/1", &Body { a: 7 }).unwrap();
        assert_eq!(v, serde_json::json!({"schema": "pagefold-test/1", "a": 7}));
        let replaced = document("pagefold-test/2", &v).unwrap();
        assert_eq!(replaced[FIELD], "pagefold-test/2");
        assert_eq!(replaced.as_object().unwrap().len(), 2);
    }

    #[test]
    fn only_objects_are_documents() {
        let err = document("pagefold-test/1", &[1, 2]).unwrap_err();
        assert!(err.to_string().contains("pagefold-test/1"), "{err}");
        assert!(document("pagefold-test/1", &3).is_err());
    }
}
