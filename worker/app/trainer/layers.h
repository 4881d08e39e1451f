// The layers of the built-in trainer's models, on Eigen matrices: fully connected, ReLU,
// 2-D convolution (im2col and one matrix product per batch), 2x2 max pooling, and the
// softmax cross-entropy loss.
//
// Activations are row-major matrices with one row per example; an image with C channels
// of H x W is one row of C*H*W values in channel, row, column order.
//
// Ownership: a layer owns the caches its backward pass needs, and refers to its
// parameters by index into the parameter list its model owns (ParamTensor, model.h).
// Thread-safety: a layer is thread-compatible; each model replica has its own layers.
// Shapes are fixed at construction; passing a matrix of another width is a programmer
// error (checked with assert in debug builds).
#ifndef ADAPS_WORKER_APP_TRAINER_LAYERS_H_
#define ADAPS_WORKER_APP_TRAINER_LAYERS_H_

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

namespace adaps::trainer {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// What kind of layer a parameter tensor belongs to; it picks the default AdaComp bin size
// (conv 50, fully connected 500) and whether a tensor may travel dense (biases).
enum class LayerKind : uint8_t { kConv = 0, kFullyConnected = 1, kBias = 2 };
// "conv", "fc", "bias".
const char* LayerKindName(LayerKind kind);

// One named flat float tensor with its gradient. `value` and `grad` have product(shape)
// elements.
struct ParamTensor {
  std::string name;
  LayerKind kind = LayerKind::kFullyConnected;
  std::vector<int> shape;
  std::vector<float> value;
  std::vector<float> grad;
  size_t size() const { return value.size(); }
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual int input_size() const = 0;
  virtual int output_size() const = 0;
  // out = layer(in); keeps what Backward needs when `training`.
  virtual void Forward(const Matrix& in, Matrix* out, bool training) = 0;
  // Given dL/dout for the last training Forward, writes dL/din and overwrites the
  // gradients of the layer's parameters.
  virtual void Backward(const Matrix& dout, Matrix* din) = 0;
};

// y = x W + b, W of shape [in, out] (tensor kind fc), b of shape [out] (kind bias).
class DenseLayer : public Layer {
 public:
  DenseLayer(std::vector<ParamTensor>* params, int weight_index, int bias_index, int in, int out)
      : params_(params), w_(weight_index), b_(bias_index), in_(in), out_(out) {}
  int input_size() const override { return in_; }
  int output_size() const override { return out_; }
  void Forward(const Matrix& in, Matrix* out, bool training) override;
  void Backward(const Matrix& dout, Matrix* din) override;

 private:
  std::vector<ParamTensor>* params_;
  int w_, b_, in_, out_;
  Matrix input_;
};

class ReluLayer : public Layer {
 public:
  explicit ReluLayer(int size) : size_(size) {}
  int input_size() const override { return size_; }
  int output_size() const override { return size_; }
  void Forward(const Matrix& in, Matrix* out, bool training) override;
  void Backward(const Matrix& dout, Matrix* din) override;

 private:
  int size_;
  Matrix input_;
};

struct ConvShape {
  int in_channels = 1;
  int height = 28;
  int width = 28;
  int out_channels = 8;
  int kernel = 5;
  int pad = 2;  // stride is 1
  int out_height() const { return height + 2 * pad - kernel + 1; }
  int out_width() const { return width + 2 * pad - kernel + 1; }
  int patch_size() const { return in_channels * kernel * kernel; }
};

// Convolution with stride 1 and zero padding. Weights of shape
// [out_channels, in_channels, kernel, kernel] (kind conv), bias [out_channels] (kind bias).
class ConvLayer : public Layer {
 public:
  ConvLayer(std::vector<ParamTensor>* params, int weight_index, int bias_index, ConvShape shape)
      : params_(params), w_(weight_index), b_(bias_index), s_(shape) {}
  int input_size() const override { return s_.in_channels * s_.height * s_.width; }
  int output_size() const override { return s_.out_channels * s_.out_height() * s_.out_width(); }
  void Forward(const Matrix& in, Matrix* out, bool training) override;
  void Backward(const Matrix& dout, Matrix* din) override;

 private:
  std::vector<ParamTensor>* params_;
  int w_, b_;
  ConvShape s_;
  Matrix cols_;  // patch_size x (batch * out_h * out_w)
  Matrix prod_;  // out_channels x (batch * out_h * out_w)
};

// 2x2 max pooling with stride 2 over C channels of H x W (H and W even).
class MaxPoolLayer : public Layer {
 public:
  MaxPoolLayer(int channels, int height, int width) : c_(channels), h_(height), w_(width) {}
  int input_size() const override { return c_ * h_ * w_; }
  int output_size() const override { return c_ * (h_ / 2) * (w_ / 2); }
  void Forward(const Matrix& in, Matrix* out, bool training) override;
  void Backward(const Matrix& dout, Matrix* din) override;

 private:
  int c_, h_, w_;
  std::vector<int32_t> argmax_;  // per output element, the input column it came from
};

// Mean softmax cross-entropy over the rows of `logits`; writes dL/dlogits to `dlogits`
// when it is not null. `labels` holds logits.rows() class indices in [0, logits.cols()).
float SoftmaxCrossEntropy(const Matrix& logits, const uint8_t* labels, Matrix* dlogits);

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_LAYERS_H_
