#include "worker/app/trainer/layers.h"

#include <cassert>
#include <cmath>
#include <limits>

namespace adaps::trainer {
namespace {

using ConstMap = Eigen::Map<const Matrix>;
using MutableMap = Eigen::Map<Matrix>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

}  // namespace

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kConv:
      return "conv";
    case LayerKind::kFullyConnected:
      return "fc";
    case LayerKind::kBias:
      return "bias";
  }
  return "unknown";
}

void DenseLayer::Forward(const Matrix& in, Matrix* out, bool training) {
  assert(in.cols() == in_);
  const ParamTensor& w = (*params_)[w_];
  const ParamTensor& b = (*params_)[b_];
  ConstMap weights(w.value.data(), in_, out_);
  ConstRowVectorMap bias(b.value.data(), out_);
  out->noalias() = in * weights;
  out->rowwise() += bias;
  if (training) input_ = in;
}

void DenseLayer::Backward(const Matrix& dout, Matrix* din) {
  ParamTensor& w = (*params_)[w_];
  ParamTensor& b = (*params_)[b_];
  MutableMap dw(w.grad.data(), in_, out_);
  RowVectorMap db(b.grad.data(), out_);
  dw.noalias() = input_.transpose() * dout;
  db = dout.colwise().sum();
  ConstMap weights(w.value.data(), in_, out_);
  din->noalias() = dout * weights.transpose();
}

void ReluLayer::Forward(const Matrix& in, Matrix* out, bool training) {
  assert(in.cols() == size_);
  *out = in.cwiseMax(0.0f);
  if (training) input_ = in;
}

void ReluLayer::Backward(const Matrix& dout, Matrix* din) {
  *din = (input_.array() > 0.0f).select(dout, 0.0f);
}

void ConvLayer::Forward(const Matrix& in, Matrix* out, bool /*training*/) {
  assert(in.cols() == input_size());
  const int batch = static_cast<int>(in.rows());
  const int oh = s_.out_height(), ow = s_.out_width(), area = oh * ow;
  const int k = s_.kernel, h = s_.height, wd = s_.width;
  cols_.resize(s_.patch_size(), static_cast<Eigen::Index>(batch) * area);
  for (int b = 0; b < batch; ++b) {
    const float* src = in.data() + static_cast<size_t>(b) * in.cols();
    for (int c = 0; c < s_.in_channels; ++c) {
      const float* plane = src + static_cast<size_t>(c) * h * wd;
      for (int ki = 0; ki < k; ++ki) {
        for (int kj = 0; kj < k; ++kj) {
          const int row = (c * k + ki) * k + kj;
          float* dst = cols_.data() + static_cast<size_t>(row) * cols_.cols() +
                       static_cast<size_t>(b) * area;
          for (int oy = 0; oy < oh; ++oy) {
            const int iy = oy + ki - s_.pad;
            float* d = dst + oy * ow;
            if (iy < 0 || iy >= h) {
              for (int ox = 0; ox < ow; ++ox) d[ox] = 0.0f;
              continue;
            }
            const float* line = plane + iy * wd;
            for (int ox = 0; ox < ow; ++ox) {
              const int ix = ox + kj - s_.pad;
              d[ox] = (ix >= 0 && ix < wd) ? line[ix] : 0.0f;
            }
          }
        }
      }
    }
  }
  const ParamTensor& w = (*params_)[w_];
  const ParamTensor& bias = (*params_)[b_];
  ConstMap weights(w.value.data(), s_.out_channels, s_.patch_size());
  prod_.noalias() = weights * cols_;
  out->resize(batch, output_size());
  for (int b = 0; b < batch; ++b) {
    for (int oc = 0; oc < s_.out_channels; ++oc) {
      out->row(b).segment(static_cast<Eigen::Index>(oc) * area, area) =
          prod_.row(oc).segment(static_cast<Eigen::Index>(b) * area, area).array() + bias.value[oc];
    }
  }
}

void ConvLayer::Backward(const Matrix& dout, Matrix* din) {
  const int batch = static_cast<int>(dout.rows());
  const int oh = s_.out_height(), ow = s_.out_width(), area = oh * ow;
  const int k = s_.kernel, h = s_.height, wd = s_.width;
  // Reuse prod_ as dL/d(prod) in the channel-major layout of the forward product.
  for (int b = 0; b < batch; ++b) {
    for (int oc = 0; oc < s_.out_channels; ++oc) {
      prod_.row(oc).segment(static_cast<Eigen::Index>(b) * area, area) =
          dout.row(b).segment(static_cast<Eigen::Index>(oc) * area, area);
    }
  }
  ParamTensor& w = (*params_)[w_];
  ParamTensor& bias = (*params_)[b_];
  MutableMap dw(w.grad.data(), s_.out_channels, s_.patch_size());
  dw.noalias() = prod_ * cols_.transpose();
  for (int oc = 0; oc < s_.out_channels; ++oc) bias.grad[oc] = prod_.row(oc).sum();
  ConstMap weights(w.value.data(), s_.out_channels, s_.patch_size());
  // cols_ is no longer needed: it becomes dL/d(cols).
  cols_.noalias() = weights.transpose() * prod_;
  din->setZero(batch, input_size());
  for (int b = 0; b < batch; ++b) {
    float* dst = din->data() + static_cast<size_t>(b) * din->cols();
    for (int c = 0; c < s_.in_channels; ++c) {
      float* plane = dst + static_cast<size_t>(c) * h * wd;
      for (int ki = 0; ki < k; ++ki) {
        for (int kj = 0; kj < k; ++kj) {
          const int row = (c * k + ki) * k + kj;
          const float* src = cols_.data() + static_cast<size_t>(row) * cols_.cols() +
                             static_cast<size_t>(b) * area;
          for (int oy = 0; oy < oh; ++oy) {
            const int iy = oy + ki - s_.pad;
            if (iy < 0 || iy >= h) continue;
            float* line = plane + iy * wd;
            const float* s = src + oy * ow;
            for (int ox = 0; ox < ow; ++ox) {
              const int ix = ox + kj - s_.pad;
              if (ix >= 0 && ix < wd) line[ix] += s[ox];
            }
          }
        }
      }
    }
  }
}

void MaxPoolLayer::Forward(const Matrix& in, Matrix* out, bool training) {
  assert(in.cols() == input_size());
  const int batch = static_cast<int>(in.rows());
  const int oh = h_ / 2, ow = w_ / 2, osize = output_size();
  out->resize(batch, osize);
  if (training) argmax_.resize(static_cast<size_t>(batch) * osize);
  for (int b = 0; b < batch; ++b) {
    const float* src = in.data() + static_cast<size_t>(b) * in.cols();
    float* dst = out->data() + static_cast<size_t>(b) * osize;
    for (int c = 0; c < c_; ++c) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          int best = c * h_ * w_ + (2 * oy) * w_ + 2 * ox;
          for (int dy = 0; dy < 2; ++dy) {
            for (int dx = 0; dx < 2; ++dx) {
              const int at = c * h_ * w_ + (2 * oy + dy) * w_ + 2 * ox + dx;
              if (src[at] > src[best]) best = at;
            }
          }
          const int o = (c * oh + oy) * ow + ox;
          dst[o] = src[best];
          if (training) argmax_[static_cast<size_t>(b) * osize + o] = best;
        }
      }
    }
  }
}

void MaxPoolLayer::Backward(const Matrix& dout, Matrix* din) {
  const int batch = static_cast<int>(dout.rows());
  const int osize = output_size();
  din->setZero(batch, input_size());
  for (int b = 0; b < batch; ++b) {
    float* dst = din->data() + static_cast<size_t>(b) * din->cols();
    const float* src = dout.data() + static_cast<size_t>(b) * osize;
    const int32_t* arg = argmax_.data() + static_cast<size_t>(b) * osize;
    for (int o = 0; o < osize; ++o) dst[arg[o]] += src[o];
  }
}

float SoftmaxCrossEntropy(const Matrix& logits, const uint8_t* labels, Matrix* dlogits) {
  const Eigen::Index batch = logits.rows();
  const Eigen::Index classes = logits.cols();
  if (dlogits != nullptr) dlogits->resize(batch, classes);
  double loss = 0.0;
  for (Eigen::Index b = 0; b < batch; ++b) {
    const float m = logits.row(b).maxCoeff();
    Eigen::RowVectorXf e = (logits.row(b).array() - m).exp();
    const float sum = e.sum();
    loss += std::log(sum) - (logits(b, labels[b]) - m);
    if (dlogits != nullptr) {
      dlogits->row(b) = e / (sum * static_cast<float>(batch));
      (*dlogits)(b, labels[b]) -= 1.0f / static_cast<float>(batch);
    }
  }
  return static_cast<float>(loss / static_cast<double>(batch));
}

}  // namespace adaps::trainer
