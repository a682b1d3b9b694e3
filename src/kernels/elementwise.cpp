// Dispatcher for elementwise ops.
#include "kernels/elementwise.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void add_inplace(Context& ctx, Tensor& a, const Tensor& b) {
  GRPO_CHECK_ACT(ctx, a);
  GRPO_CHECK_ACT(ctx, b);
  GRPO_CHECK_MSG(a.dtype == b.dtype && a.numel() == b.numel(), "add_inplace: a and b must match");
  GRPO_DISPATCH(ctx, add_inplace, ctx, a, b);
}

void scale_inplace(Context& ctx, Tensor& x, float s) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_DISPATCH(ctx, scale_inplace, ctx, x, s);
}

void cast(Context& ctx, Tensor& dst, const Tensor& src) {
  GRPO_CHECK_DEV(ctx, dst);
  GRPO_CHECK_DEV(ctx, src);
  auto is_float = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  GRPO_CHECK_MSG(is_float(dst.dtype) && is_float(src.dtype), "cast: f32/bf16/f16 only");
  GRPO_CHECK_MSG(dst.numel() == src.numel(), "cast: dst and src must have the same numel");
  GRPO_DISPATCH(ctx, cast, ctx, dst, src);
}

void swiglu_forward(Context& ctx, Tensor& out, const Tensor& gate_up) {
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_ACT(ctx, gate_up);
  GRPO_CHECK_MSG(out.ndim == 2, "swiglu_forward: out must be (N,F)");
  GRPO_CHECK_SHAPE2(gate_up, out.shape[0], 2 * out.shape[1]);
  GRPO_CHECK_MSG(out.dtype == gate_up.dtype, "swiglu_forward: dtypes differ");
  GRPO_DISPATCH(ctx, swiglu_forward, ctx, out, gate_up);
}

void swiglu_backward(Context& ctx, Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  GRPO_CHECK_ACT(ctx, dgate_up);
  GRPO_CHECK_ACT(ctx, dout);
  GRPO_CHECK_ACT(ctx, gate_up);
  GRPO_CHECK_MSG(dout.ndim == 2, "swiglu_backward: dout must be (N,F)");
  GRPO_CHECK_SHAPE2(gate_up, dout.shape[0], 2 * dout.shape[1]);
  GRPO_CHECK_SHAPE2(dgate_up, dout.shape[0], 2 * dout.shape[1]);
  GRPO_DISPATCH(ctx, swiglu_backward, ctx, dgate_up, dout, gate_up);
}

namespace {
void qkv_check(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv) {
  for (const Tensor* t : {&q, &k, &v, &qkv}) {
    GRPO_CHECK_ACT(ctx, *t);
    GRPO_CHECK_MSG(t->dtype == qkv.dtype, "qkv_split/merge: dtypes differ");
  }
  GRPO_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3, "qkv_split/merge: q, k, v must be (T,H,D)");
  const int64_t T = q.shape[0], D = q.shape[2];
  GRPO_CHECK_MSG(k.shape[0] == T && v.shape[0] == T && k.shape[2] == D && v.shape[2] == D && k.shape[1] == v.shape[1],
                 "qkv_split/merge: q (T,Hq,D), k and v (T,Hkv,D)");
  GRPO_CHECK_SHAPE2(qkv, T, (q.shape[1] + 2 * k.shape[1]) * D);
}
}  // namespace

void qkv_split(Context& ctx, Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  qkv_check(ctx, q, k, v, qkv);
  GRPO_DISPATCH(ctx, qkv_split, ctx, q, k, v, qkv);
}

void qkv_merge(Context& ctx, Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  qkv_check(ctx, dq, dk, dv, dqkv);
  GRPO_DISPATCH(ctx, qkv_merge, ctx, dqkv, dq, dk, dv);
}

}  // namespace grpo
