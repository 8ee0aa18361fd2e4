//! The worker API's response streams, as its gRPC service (and the synthetic engine that stands
//! in for a model in `bench gateway`) return them.

use std::pin::Pin;

use ferrite_proto::worker::v1 as pb;
use futures::Stream;
use tonic::Status;

pub(crate) type TokenStream =
    Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;

pub(crate) type KvStream = Pin<Box<dyn Stream<Item = Result<pb::KvCacheUpdate, Status>> + Send>>;
