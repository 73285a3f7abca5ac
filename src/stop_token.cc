#include "kwq/stop_token.h"

#include <utility>

#include "internal/context_node.h"

namespace kwq {
namespace {

const absl::Status& StopRequested() {
  static const absl::Status* const status =
      new absl::Status(absl::CancelledError("stop requested"));
  return *status;
}

// Cancels its node when the stop is requested. The node owns this object and destroys it
// (first) when it dies; the std::stop_callback destructor waits for a callback running on
// another thread, and TryRef fails for a dying node, so the node is always valid here.
class StopTokenLink final : public internal::ContextAttachment {
 public:
  StopTokenLink(internal::ContextNode* node, std::stop_token token)
      : callback_(std::move(token), Cancel{node}) {}

 private:
  struct Cancel {
    internal::ContextNode* node;
    void operator()() const {
      if (!internal::TryRef(node)) return;
      internal::CancelTree(node, &internal::CanceledError(), StopRequested());
      internal::Unref(node);
    }
  };
  std::stop_callback<Cancel> callback_;
};

}  // namespace

std::stop_token ToStopToken(const Context& ctx) {
  std::stop_source source;
  std::stop_token token = source.get_token();
  // Freed with ctx's node, also when ctx is a value context whose AfterFuncs would
  // otherwise stay on a long-lived cancellable ancestor.
  internal::AfterFuncFreedWithNode(
      internal::NodeOf(ctx), [source = std::move(source)]() mutable { source.request_stop(); });
  return token;
}

CancelableContext WithStopToken(const Context& parent, std::stop_token token) {
  CancelableContext child = WithCancel(parent);
  // WithCancel returned the only handles, so nobody else can see the node yet; the
  // attachment is set before the node is shared. A stop already requested runs the
  // callback right here, in the std::stop_callback constructor.
  internal::ContextNode* node = internal::NodeOf(child.context);
  node->attachment = std::make_unique<StopTokenLink>(node, std::move(token));
  return child;
}

}  // namespace kwq
