//! The argument mapping of a compensation (reference §11): a JSON template whose strings
//! starting with `$` are RFC 9535 JSONPath queries (through `serde_json_path`) over the
//! step's document `{"args": …, "output": …}`; every other value is literal.
//!
//! A query must match: one that selects nothing (a misspelled key, an output of another
//! shape) makes the compensation fail, never run with an empty value that undoes nothing;
//! only a list that is there and empty (`entities` is `[]` for `$.output.entities[*].name`)
//! gives an empty list, since the call then acted on nothing.
//!
//! An object `{"$each": QUERY, "map": TEMPLATE}` is a list with one element per match of
//! `QUERY`: `TEMPLATE` filled for each, where strings starting with `@` are queries over
//! that match (`@.entityName`) and those starting with `$` over the whole document. It
//! builds the argument of tools that take a list of records (`delete_observations`'s
//! `deletions` from `add_observations`' `observations`).

use agent_kernel_api::ToolError;
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

/// The key of a per-element list (`{"$each": QUERY, "map": TEMPLATE}`).
const EACH: &str = "$each";
/// The template of each element of a per-element list.
const EACH_MAP: &str = "map";

/// The query and template of a per-element list, when `map` is one.
fn each(map: &Map<String, Value>) -> Option<(&Value, &Value)> {
    map.get(EACH)
        .map(|query| (query, map.get(EACH_MAP).unwrap_or(&Value::Null)))
}

fn check(value: &Value, reads_output: &mut bool, in_each: bool) -> Result<(), String> {
    match value {
        Value::String(text) if text.starts_with('$') => {
            JsonPath::parse(text)
                .map_err(|err| format!("`{text}` is not a JSONPath query: {err}"))?;
            if !(text.starts_with("$.args") || text.starts_with("$['args']")) {
                *reads_output = true;
            }
            Ok(())
        }
        Value::String(text) if in_each && text.starts_with('@') => {
            let query = format!("${}", &text[1..]);
            JsonPath::parse(&query)
                .map(|_| ())
                .map_err(|err| format!("`{text}` is not a query of the element: {err}"))
        }
        Value::Array(items) => items
            .iter()
            .try_for_each(|item| check(item, reads_output, in_each)),
        Value::Object(map) => match each(map) {
            Some((query, template)) => {
                let Value::String(query) = query else {
                    return Err(format!("`{EACH}` is a JSONPath query starting with `$`"));
                };
                if !query.starts_with('$') || map.len() != 2 || !map.contains_key(EACH_MAP) {
                    return Err(format!(
                        "a per-element list is `{{\"{EACH}\" = \"$…\", {EACH_MAP} = {{…}}}}`, with nothing else"
                    ));
                }
                check(&Value::String(query.clone()), reads_output, in_each)?;
                check(template, reads_output, true)
            }
            None => map
                .values()
                .try_for_each(|item| check(item, reads_output, in_each)),
        },
        _ => Ok(()),
    }
}

/// The value `query` (starting with `$`) selects in `document`: the list of its matches
/// for a query that can select several, else its one match; an error when it selects
/// nothing.
fn select(query: &str, shown: &str, document: &Value) -> Result<Value, String> {
    let path = JsonPath::parse(query).map_err(|err| format!("`{shown}`: {err}"))?;
    let nodes = path.query(document);
    if selects_many(query) {
        let all: Vec<Value> = nodes.all().into_iter().cloned().collect();
        if all.is_empty() && !walks_an_empty_list(query, document) {
            return Err(format!(
                "`{shown}` matches nothing in the step's record, so the compensation would undo nothing"
            ));
        }
        Ok(Value::Array(all))
    } else {
        Ok(nodes
            .exactly_one()
            .map_err(|err| format!("`{shown}` selects no single value ({err})"))?
            .clone())
    }
}

/// Whether `query` selects nothing because the list it walks (the part before its first
/// `[*]`) is there and empty: the call acted on nothing, so there is nothing to undo.
fn walks_an_empty_list(query: &str, document: &Value) -> bool {
    let Some(idx) = query.find("[*]") else {
        return false;
    };
    JsonPath::parse(&query[..idx]).is_ok_and(|path| {
        path.query(document)
            .exactly_one()
            .is_ok_and(|node| node.as_array().is_some_and(Vec::is_empty))
    })
}

/// `value` filled from `document`, and `@` queries from `element` when inside a
/// per-element list.
fn fill(value: &Value, document: &Value, element: Option<&Value>) -> Result<Value, String> {
    Ok(match value {
        Value::String(text) if text.starts_with('$') => select(text, text, document)?,
        Value::String(text) if text.starts_with('@') && element.is_some() => {
            let query = format!("${}", &text[1..]);
            select(&query, text, element.unwrap_or(&Value::Null))?
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| fill(item, document, element))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => match each(map) {
            Some((Value::String(query), template)) => {
                let Value::Array(matches) = select(query, query, document)? else {
                    return Err(format!("`{query}` selects one value, not a list"));
                };
                Value::Array(
                    matches
                        .iter()
                        .map(|item| fill(template, document, Some(item)))
                        .collect::<Result<_, _>>()?,
                )
            }
            _ => Value::Object(
                map.iter()
                    .map(|(key, item)| Ok((key.clone(), fill(item, document, element)?)))
                    .collect::<Result<Map<_, _>, String>>()?,
            ),
        },
        literal => literal.clone(),
    })
}

impl Mapping {
    /// The template `args` (a JSON object), its queries parsed now.
    ///
    /// # Errors
    ///
    /// [`ToolError::invalid_args`] naming the first query that does not parse, or a
    /// template that is not an object.
    pub fn new(template: Value) -> Result<Mapping, ToolError> {
        if !template.is_object() {
            return Err(ToolError::invalid_args("the arguments are an object"));
        }
        let mut reads_output = false;
        check(&template, &mut reads_output, false).map_err(ToolError::invalid_args)?;
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
    /// [`ToolError::failed`] naming the query that selects nothing (or several values where
    /// one is wanted, or one where a per-element list wants several).
    pub fn arguments(&self, args: &Value, output: Option<&Value>) -> Result<Value, ToolError> {
        let document = serde_json::json!({ "args": args, "output": output });
        fill(&self.template, &document, None).map_err(ToolError::failed)
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
        assert!(error.message().contains("$.output.entities["), "{error}");
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
    fn a_query_that_matches_nothing_fails_rather_than_undo_nothing() {
        // `entity` where the output says `entities`: the call would get `[]`.
        let mapping =
            Mapping::new(json!({"entityNames": "$.output.entity[*].name"})).expect("valid");
        let output = json!({"entities": [{"name": "x"}]});
        let error = mapping
            .arguments(&json!({}), Some(&output))
            .expect_err("matches nothing");
        assert!(error.message().contains("matches nothing"), "{error}");
        assert!(
            error.message().contains("$.output.entity[*].name"),
            "{error}"
        );
        // A list that is there and empty: the call acted on nothing, nothing to undo.
        let empty = json!({"entity": []});
        assert_eq!(
            mapping.arguments(&json!({}), Some(&empty)).expect("fills"),
            json!({"entityNames": []})
        );
    }

    #[test]
    fn a_per_element_list_builds_one_argument_per_match() {
        let mapping = Mapping::new(json!({
            "deletions": {
                "$each": "$.args.observations[*]",
                "map": { "entityName": "@.entityName", "observations": "@.contents", "by": "$.args.by" },
            },
        }))
        .expect("valid");
        assert!(!mapping.reads_output());
        let args = json!({
            "by": "agent",
            "observations": [
                {"entityName": "a", "contents": ["one", "two"]},
                {"entityName": "b", "contents": ["three"]},
            ],
        });
        assert_eq!(
            mapping.arguments(&args, None).expect("fills"),
            json!({"deletions": [
                {"entityName": "a", "observations": ["one", "two"], "by": "agent"},
                {"entityName": "b", "observations": ["three"], "by": "agent"},
            ]})
        );
        let error = mapping
            .arguments(
                &json!({"by": "agent", "observations": [{"contents": []}]}),
                None,
            )
            .expect_err("no entityName");
        assert!(error.message().contains("@.entityName"), "{error}");
        assert!(Mapping::new(json!({"x": {"$each": "$.args.a[*]"}})).is_err());
        assert!(Mapping::new(json!({"x": {"$each": "$.args.a[*]", "map": {}, "y": 1}})).is_err());
        assert!(Mapping::new(json!({"x": {"$each": "$.args.a[*]", "map": {"z": "@.["}}})).is_err());
    }

    #[test]
    fn an_invalid_query_is_refused_when_the_file_is_read() {
        let error = Mapping::new(json!({"x": "$.args[?"})).expect_err("invalid");
        assert!(
            error.message().contains("is not a JSONPath query"),
            "{error}"
        );
        assert!(Mapping::new(json!(["$.args"])).is_err());
    }
}
