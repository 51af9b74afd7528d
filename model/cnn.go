package model

import "fmt"

// CNN zoo models: torchvision architectures on 224×224×3 images with 1000
// classes, per-worker batch cnnBatch. One Layer per convolution (with its
// BatchNorm, if any) and per linear layer; parameter-free modules (ReLU,
// pooling, dropout) have no layer and their cost is neglected.

const (
	cnnBatch = 32
	imgSize  = 224
	classes  = 1000
)

// alexNet is torchvision's AlexNet (features.0 … classifier.6).
func alexNet() *Profile {
	b := newBuilder("alexnet", cnnBatch)
	type convSpec struct{ idx, cout, k, stride, pad, poolAfter int }
	specs := []convSpec{
		{0, 64, 11, 4, 2, 1},
		{3, 192, 5, 1, 2, 1},
		{6, 384, 3, 1, 1, 0},
		{8, 256, 3, 1, 1, 0},
		{10, 256, 3, 1, 1, 1},
	}
	h, cin := imgSize, 3
	for _, s := range specs {
		h = outSize(h, s.k, s.stride, s.pad)
		name := fmt.Sprintf("features.%d", s.idx)
		b.add(name, convFLOPs(cin, s.cout, s.k, h, h), conv(name, cin, s.cout, s.k, true))
		cin = s.cout
		if s.poolAfter == 1 {
			h = outSize(h, 3, 2, 0) // MaxPool2d(3, stride 2)
		}
	}
	// AdaptiveAvgPool2d((6, 6)): the map is already 6×6 at 224×224 input.
	b.addClassifier(cin*6*6, []fcSpec{{1, 4096}, {4, 4096}, {6, classes}})
	return b.build()
}

// vgg16 is torchvision's VGG16 without batch normalisation (configuration D).
func vgg16() *Profile {
	b := newBuilder("vgg16", cnnBatch)
	const pool = -1
	cfg := []int{64, 64, pool, 128, 128, pool, 256, 256, 256, pool, 512, 512, 512, pool, 512, 512, 512, pool}
	h, cin, idx := imgSize, 3, 0
	for _, c := range cfg {
		if c == pool {
			h /= 2 // MaxPool2d(2, 2)
			idx++
			continue
		}
		name := fmt.Sprintf("features.%d", idx)
		b.add(name, convFLOPs(cin, c, 3, h, h), conv(name, cin, c, 3, true))
		cin = c
		idx += 2 // Conv2d, ReLU
	}
	b.addClassifier(cin*7*7, []fcSpec{{0, 4096}, {3, 4096}, {6, classes}})
	return b.build()
}

// fcSpec is one Linear layer of a torchvision classifier: its index in the
// classifier Sequential and its output features.
type fcSpec struct{ idx, out int }

// addClassifier adds the Linear layers of a torchvision classifier
// (AlexNet's and VGG's), named classifier.<idx>, the first fed in features
// and each later one the output of the one before.
func (b *builder) addClassifier(in int, fcs []fcSpec) {
	for _, fc := range fcs {
		name := fmt.Sprintf("classifier.%d", fc.idx)
		b.add(name, linearFLOPs(in, fc.out, 1), linear(name, in, fc.out, true))
		in = fc.out
	}
}

// resNet is torchvision's bottleneck ResNet (v1.5: stride on the 3×3 conv)
// with the given number of blocks per stage ([3,4,6,3] is ResNet-50,
// [3,4,23,3] is ResNet-101). Convolutions have no bias; each is followed by
// a BatchNorm that shares its Layer.
func resNet(name string, blocks [4]int) *Profile {
	b := newBuilder(name, cnnBatch)
	h := outSize(imgSize, 7, 2, 3) // 112
	b.add("conv1", convFLOPs(3, 64, 7, h, h), conv("conv1", 3, 64, 7, false), norm("bn1", 64))
	h = outSize(h, 3, 2, 1) // max pool: 56
	inplanes := 64
	const expansion = 4
	for stage, n := range blocks {
		planes := 64 << stage
		for blk := 0; blk < n; blk++ {
			stride := 1
			if blk == 0 && stage > 0 {
				stride = 2
			}
			pre := fmt.Sprintf("layer%d.%d", stage+1, blk)
			hout := outSize(h, 3, stride, 1)
			b.add(pre+".conv1", convFLOPs(inplanes, planes, 1, h, h),
				conv(pre+".conv1", inplanes, planes, 1, false), norm(pre+".bn1", planes))
			b.add(pre+".conv2", convFLOPs(planes, planes, 3, hout, hout),
				conv(pre+".conv2", planes, planes, 3, false), norm(pre+".bn2", planes))
			b.add(pre+".conv3", convFLOPs(planes, planes*expansion, 1, hout, hout),
				conv(pre+".conv3", planes, planes*expansion, 1, false), norm(pre+".bn3", planes*expansion))
			if stride != 1 || inplanes != planes*expansion {
				b.add(pre+".downsample", convFLOPs(inplanes, planes*expansion, 1, hout, hout),
					conv(pre+".downsample.0", inplanes, planes*expansion, 1, false),
					norm(pre+".downsample.1", planes*expansion))
			}
			inplanes, h = planes*expansion, hout
		}
	}
	b.add("fc", linearFLOPs(inplanes, classes, 1), linear("fc", inplanes, classes, true))
	return b.build()
}
