//! Prints the canonical wire listing of a `FileDescriptorSet` file
//! (from `protoc --descriptor_set_out`), or of our own protos without an argument.
//! Used to produce and refresh `tests/golden/wire-contract.txt`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bytes = match std::env::args_os().nth(1) {
        Some(path) => std::fs::read(path)?,
        None => proto::grpc::FILE_DESCRIPTOR_SET.to_vec(),
    };
    print!("{}", proto::wire::listing(&bytes)?);
    Ok(())
}
