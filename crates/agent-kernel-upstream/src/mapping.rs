//! The argument mapping of a compensation (CONTRACT §11): a JSON template whose strings
//! starting with `$` are RFC 9535 JSONPath queries (through `serde_json_path`) over the
//! step's document `{"args": …, "output": …}`; every other value is literal.

use serde_json::{Map, Value};
use serde_json_path::JsonPath;

/// A compensation's arguments, as a template checked when the tools file is read.
#[derive(Debug, Clone)]
pub struct Mapping {
    template: Value,
    reads_output: bool,
}

/// Whether a query can select several nodes (a wildcard, descendants, a filter, a slice
/// or a union): its value is then the list of its matches, else its one match.
fn selects_many(query: &str) -> bool {
    query.contains('*')
        || query.contains("..")
        || query.contains("[?")
        || query.contains(':')
        || query.contains(',')
}

fn check(value: &Value, reads_output: &mut bool) -> Result<(), String> {
    match value {
        Value::String(text) if text.starts_with('$') => {
            JsonPath::parse(text)
                .map_err(|err| format!("`{text}` is not a JSONPath query: {err}"))?;
            if !(text.starts_with("$.args") || text.starts_with("$['args']")) {
                *reads_output = true;
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|item| check(item, reads_output)),
        Value::Object(map) => map.values().try_for_each(|item| check(item, reads_output)),
        _ => Ok(()),
    }
}

fn fill(value: &Value, document: &Value) -> Result<Value, String> {
    Ok(match value {
        Value::String(text) if text.starts_with('$') => {
            let path = JsonPath::parse(text).map_err(|err| format!("`{text}`: {err}"))?;
            let nodes = path.query(document);
            if selects_many(text) {
                Value::Array(nodes.all().into_iter().cloned().collect())
            } else {
                nodes
                    .exactly_one()
                    .map_err(|err| format!("`{text}` selects no single value ({err})"))?
                    .clone()
            }
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| fill(item, document))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| Ok((key.clone(), fill(item, document)?)))
                .collect::<Result<Map<_, _>, String>>()?,
        ),
        literal => literal.clone(),
    })
}

impl Mapping {
    /// The template `args` (a JSON object), its queries parsed now.
    ///
    /// # Errors
    ///
    /// A message naming the first query that does not parse, or a template that is not an
    /// object.
    pub fn new(template: Value) -> Result<Mapping, String> {
        if !template.is_object() {
            return Err("the arguments are an object".to_owned());
        }
        let mut reads_output = false;
        check(&template, &mut reads_output)?;
        Ok(Mapping {
            template,
            reads_output,
        })
    }

    /// Whether a query reads anything but `$.args`: then a call of unknown outcome, whose
    /// output was never recorded, cannot be compensated blindly.
    pub fn reads_output(&self) -> bool {
        self.reads_output
    }

    /// The compensation's arguments for a step called with `args` that answered `output`.
    ///
    /// # Errors
    ///
    /// A message naming the query that selects nothing (or several values where one is
    /// wanted).
    pub fn arguments(&self, args: &Value, output: Option<&Value>) -> Result<Value, String> {
        let document = serde_json::json!({ "args": args, "output": output });
        fill(&self.template, &document)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn queries_fill_the_template_and_literals_stay() {
        let mapping = Mapping::new(json!({
            "names": "$.output.entities[*].name",
            "path": "$.args.path",
            "mode": "hard",
            "nested": { "first": "$.output.entities[0].name" },
        }))
        .expect("valid");
        assert!(mapping.reads_output());
        let args = json!({"path": "a.txt"});
        let output = json!({"entities": [{"name": "x"}, {"name": "y"}]});
        assert_eq!(
            mapping.arguments(&args, Some(&output)).expect("fills"),
            json!({
                "names": ["x", "y"],
                "path": "a.txt",
                "mode": "hard",
                "nested": { "first": "x" },
            })
        );
        let error = mapping.arguments(&args, None).expect_err("no output");
        assert!(error.contains("$.output.entities[0].name"), "{error}");
    }

    #[test]
    fn a_mapping_of_the_arguments_alone_can_compensate_blindly() {
        let mapping = Mapping::new(json!({"path": "$.args.path"})).expect("valid");
        assert!(!mapping.reads_output());
        assert_eq!(
            mapping
                .arguments(&json!({"path": "p"}), None)
                .expect("fills"),
            json!({"path": "p"})
        );
    }

    #[test]
    fn an_invalid_query_is_refused_when_the_file_is_read() {
        let error = Mapping::new(json!({"x": "$.args[?"})).expect_err("invalid");
        assert!(error.contains("is not a JSONPath query"), "{error}");
        assert!(Mapping::new(json!(["$.args"])).is_err());
    }
}
