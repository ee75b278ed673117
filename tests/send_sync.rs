//! Compile-time checks that the public types can cross threads and tasks.

use rollout_buffer::*;

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<SequenceBuffer>();
    send_sync::<Batch>();
    send_sync::<Sample>();
    send_sync::<Tensor>();
    send_sync::<Patch>();
    send_sync::<Error>();
    send_sync::<Stats>();
}

#[test]
fn futures_are_send() {
    let buf = SequenceBuffer::new(1, [RpcDef::new("r", 1)]).expect("valid");
    send(&buf.put_batch(vec![]));
    send(&buf.try_put_batch(vec![]));
    send(&buf.amend_batch(&[], vec![]));
    send(&buf.get_batch_for_rpc("r"));
    send(&buf.get_batch_for_rpc_timeout("r", std::time::Duration::from_secs(1)));
    send(&buf.put_batch_timeout(vec![], std::time::Duration::from_secs(1)));
}
