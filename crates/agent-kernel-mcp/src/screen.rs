//! Every request with an id gets an answer. The SDK drops a line it cannot parse, so a
//! request nested deeper than its JSON parser goes (128 levels) would never be answered:
//! the server reads its input first, line by line, and puts in the place of a request
//! nested deeper than [`MESSAGE_DEPTH_MAX`] a short one of its own
//! ([`REFUSED_METHOD`]), with the same id, which the handler answers with an
//! invalid-params error saying why. A known method whose params do not have its shape
//! reaches the handler as a custom request, which [`custom_request_error`] answers the same
//! way (the SDK's default answer, "method not found", would be wrong).

use rmcp::model::{CallToolRequestParams, ClientJsonRpcMessage, ErrorCode, ErrorData as McpError};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader, DuplexStream};

/// The deepest nesting of objects and arrays a message may have; its tool arguments sit
/// four levels inside it (`params.arguments.args`).
pub const MESSAGE_DEPTH_MAX: usize = 100;

/// The method of the request put in the place of one refused before the SDK reads it.
pub(crate) const REFUSED_METHOD: &str = "agent-kernel/refused";

/// The size of the pipe between the screening task and the SDK, in bytes.
const SCREEN_PIPE_BYTES: usize = 64 * 1024;

/// The methods of the protocol a client may call, whose params the SDK checks.
const KNOWN_METHODS: [&str; 17] = [
    "initialize",
    "ping",
    "server/discover",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
    "roots/list",
    "sampling/createMessage",
];

/// `input`, screened (see the module's documentation), for the SDK to read: a task copies
/// it until its end, which the SDK then sees.
pub(crate) fn screened(input: impl AsyncRead + Unpin + Send + 'static) -> DuplexStream {
    let (mut to_sdk, from_screen) = tokio::io::duplex(SCREEN_PIPE_BYTES);
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            match input.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let written = match screen(&line) {
                Screened::Pass => to_sdk.write_all(&line).await,
                Screened::Replace(replacement) => to_sdk.write_all(&replacement).await,
            };
            if written.is_err() {
                // The SDK stopped reading: the session is over.
                break;
            }
        }
    });
    from_screen
}

/// What becomes of one line of input.
#[derive(Debug, PartialEq, Eq)]
enum Screened {
    /// Given to the SDK as it is.
    Pass,
    /// Given to the SDK in this form (a line, newline included).
    Replace(Vec<u8>),
}

fn screen(line: &[u8]) -> Screened {
    let scan = scan(line);
    let reason = if scan.depth_max > MESSAGE_DEPTH_MAX {
        format!(
            "the message nests objects and arrays {} levels deep, more than the {MESSAGE_DEPTH_MAX} this server reads (tool arguments sit 4 levels inside it)",
            scan.depth_max
        )
    } else {
        // As the SDK reads it: a byte-order mark first is ignored.
        let body = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
            Ok(_) => return Screened::Pass,
            // Not a request the SDK reads (params that are not an object, say): refused
            // here when it has an id to answer; anything else is the SDK's to handle.
            Err(error) if scan.id.is_some() && !line.trim_ascii().is_empty() => {
                format!("the request is not one this server reads: {error}")
            }
            Err(_) => return Screened::Pass,
        }
    };
    let id = scan
        .id
        .and_then(|token| serde_json::from_slice::<Value>(token).ok())
        .filter(|id| id.is_number() || id.is_string());
    match id {
        Some(id) => {
            let mut replacement = json!({
                "jsonrpc": "2.0",
                "id": id,
                "method": REFUSED_METHOD,
                "params": { "reason": reason },
            })
            .to_string()
            .into_bytes();
            replacement.push(b'\n');
            Screened::Replace(replacement)
        }
        None if scan.depth_max <= MESSAGE_DEPTH_MAX => Screened::Pass,
        None => {
            // A notification (or no message at all): there is no one to answer.
            tracing::warn!("{reason}; it has no id, so it is dropped unanswered");
            Screened::Replace(b"\n".to_vec())
        }
    }
}

/// What one pass over a line finds: its deepest nesting, and the raw value of its
/// top-level `id` member.
struct Scan<'a> {
    depth_max: usize,
    id: Option<&'a [u8]>,
}

/// Scans `line` as JSON text without parsing it: strings (and their escapes) are skipped,
/// `{` and `[` outside them counted.
fn scan(line: &[u8]) -> Scan<'_> {
    let mut depth = 0_usize;
    let mut depth_max = 0_usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut string_start = 0;
    // The last string closed at depth 1, and whether a `:` followed it (it was a key).
    let mut last_key: Option<&[u8]> = None;
    let mut id_start: Option<usize> = None;
    let mut id = None;
    for (at, &byte) in line.iter().enumerate() {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 1 && id_start.is_none() {
                        last_key = Some(&line[string_start..at]);
                    }
                }
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => {
                in_string = true;
                string_start = at + 1;
            }
            b'{' | b'[' => {
                depth += 1;
                depth_max = depth_max.max(depth);
            }
            b'}' | b']' | b',' if depth == 1 && id_start.is_some() => {
                id = id_start.take().map(|start| line[start..at].trim_ascii());
                last_key = None;
                if byte != b',' {
                    depth -= 1;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b':' if depth == 1 => {
                let key = last_key.take();
                id_start = id_start.or((key == Some(b"id".as_slice())).then_some(at + 1));
            }
            b',' if depth == 1 => last_key = None,
            _ => {}
        }
    }
    Scan { depth_max, id }
}

/// The answer to a request the SDK could not read as any method it knows: a request
/// refused by the screen, or a known method whose params do not have its shape, is an
/// invalid-params error saying why; an unknown method is "method not found".
pub(crate) fn custom_request_error(method: &str, params: Option<&Value>) -> McpError {
    if method == REFUSED_METHOD {
        let reason = params
            .and_then(|params| params["reason"].as_str())
            .unwrap_or("the request was refused")
            .to_owned();
        return McpError::invalid_params(reason, None);
    }
    if !KNOWN_METHODS.contains(&method) {
        return McpError::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("no method `{method}`"),
            None,
        );
    }
    let why = match (method, params) {
        (_, None) => "it has no params".to_owned(),
        ("tools/call", Some(params)) => {
            match serde_json::from_value::<CallToolRequestParams>(params.clone()) {
                Err(error) => error.to_string(),
                Ok(_) => "they are not what it takes".to_owned(),
            }
        }
        (_, Some(params)) if !params.is_object() => "they are not an object".to_owned(),
        _ => "they are not what it takes".to_owned(),
    };
    McpError::invalid_params(format!("invalid params for `{method}`: {why}"), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        let mut text = "1".to_owned();
        for _ in 0..depth {
            text = format!("{{\"a\":[{text}]}}");
        }
        text
    }

    #[test]
    fn a_shallow_line_passes_as_it_is() {
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#;
        assert_eq!(screen(line), Screened::Pass);
        let scan = scan(line);
        assert_eq!(scan.depth_max, 2);
        assert_eq!(scan.id, Some(b"1".as_slice()));
    }

    #[test]
    fn a_deep_request_is_replaced_by_a_refusal_with_its_id() {
        for id in [r#""req-7""#, "7"] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"arguments":{}}},"id":{id}}}"#,
                nested(100)
            );
            let Screened::Replace(replacement) = screen(line.as_bytes()) else {
                panic!("replaced");
            };
            let message: Value = serde_json::from_slice(&replacement).expect("parses");
            assert_eq!(
                message["id"],
                serde_json::from_str::<Value>(id).expect("id")
            );
            assert_eq!(message["method"], REFUSED_METHOD);
            assert!(
                message["params"]["reason"]
                    .as_str()
                    .expect("a reason")
                    .contains("202 levels deep"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_request_whose_params_are_not_an_object_is_refused_with_its_id() {
        let line = br#"{"jsonrpc":"2.0","id":102,"method":"tools/call","params":"text"}"#;
        let Screened::Replace(replacement) = screen(line) else {
            panic!("replaced");
        };
        let message: Value = serde_json::from_slice(&replacement).expect("parses");
        assert_eq!(message["id"], 102);
        assert_eq!(message["method"], REFUSED_METHOD);
        // Not JSON at all, or a response from the client: the SDK's.
        assert_eq!(screen(b"{not json\n"), Screened::Pass);
        assert_eq!(
            screen(b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"),
            Screened::Pass
        );
        assert_eq!(
            screen(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n"),
            Screened::Pass
        );
    }

    #[test]
    fn ids_and_keys_inside_strings_or_deeper_objects_are_not_the_id() {
        let line = br#"{"method":"x","params":{"id":5,"s":"\"id\":9"},"id" : "real" }"#;
        assert_eq!(scan(line).id, Some(br#""real""#.as_slice()));
        let no_id = br#"{"method":"x","params":{"id":5}}"#;
        assert_eq!(scan(no_id).id, None);
    }

    #[test]
    fn a_known_method_with_params_of_another_shape_is_invalid_params() {
        let error = custom_request_error("tools/call", Some(&json!({ "name": 5 })));
        assert_eq!(error.code, ErrorCode::INVALID_PARAMS);
        assert!(error.message.contains("tools/call"), "{}", error.message);
        let error = custom_request_error("no/such", Some(&json!({})));
        assert_eq!(error.code, ErrorCode::METHOD_NOT_FOUND);
    }
}
