//! `fs.read`.

use serde_json::json;

use crate::{Fixture, ctx};

#[tokio::test]
async fn reads_text() {
    let fixture = Fixture::new();
    let tool = fixture.tool("fs.read");
    let args = json!({ "path": "workspace/a.txt" });
    tool.check(&args).expect("check");
    let output = tool.execute(&ctx("fs.read", 0), &args).await.expect("read");
    assert_eq!(
        output.data,
        json!({ "path": "workspace/a.txt", "bytes": 5, "content": "alpha" })
    );
}

#[tokio::test]
async fn non_utf8_is_a_definite_failure() {
    let fixture = Fixture::new();
    fixture.write("workspace/bin", &[b'o', b'k', 0xff, 0xfe]);
    let tool = fixture.tool("fs.read");
    let error = tool
        .execute(&ctx("fs.read", 0), &json!({ "path": "workspace/bin" }))
        .await
        .expect_err("not text");
    assert!(!error.is_uncertain(), "{error}");
    assert!(
        error
            .message()
            .contains("not UTF-8 text (invalid byte at offset 2)"),
        "{error}"
    );
}

#[tokio::test]
async fn a_missing_file_is_a_definite_failure() {
    let fixture = Fixture::new();
    let error = fixture
        .tool("fs.read")
        .execute(&ctx("fs.read", 0), &json!({ "path": "workspace/none" }))
        .await
        .expect_err("missing");
    assert!(!error.is_uncertain() && !error.is_denied(), "{error}");
    assert!(error.message().contains("does not exist"), "{error}");
}

#[tokio::test]
async fn a_link_out_of_the_root_is_denied_when_read() {
    let fixture = Fixture::new();
    std::os::unix::fs::symlink("../outside/secret.txt", fixture.path("workspace/rel"))
        .expect("symlink");
    let tool = fixture.tool("fs.read");
    let args = json!({ "path": "workspace/rel" });
    tool.check(&args)
        .expect("lexically fine: the kernel decides when the file is opened");
    let error = tool
        .execute(&ctx("fs.read", 0), &args)
        .await
        .expect_err("escape");
    assert!(error.is_denied(), "{error}");
}

#[tokio::test]
async fn a_file_over_max_io_bytes_is_denied() {
    let fixture = Fixture::new(); // max_io_bytes = 64
    fixture.write("workspace/big.txt", &[b'x'; 65]);
    let error = fixture
        .tool("fs.read")
        .execute(&ctx("fs.read", 0), &json!({ "path": "workspace/big.txt" }))
        .await
        .expect_err("too large");
    assert!(error.is_denied(), "{error}");
    assert!(
        error
            .message()
            .contains("65 bytes exceed the limit of 64 bytes"),
        "{error}"
    );
}
