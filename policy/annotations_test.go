package policy

import (
	"strings"
	"testing"
)

func TestParseAnnotations(t *testing.T) {
	tests := []struct {
		ann     map[string]string
		want    AnnotationRequest
		wantErr string
	}{
		{ann: nil, want: AnnotationRequest{}},
		{ann: map[string]string{AnnotationGPUProfile: "1g.18gb"}, want: AnnotationRequest{Profile: "1g.18gb"}},
		{ann: map[string]string{AnnotationGPUProfile: " 3g.71gb ", AnnotationGPUCount: "2"}, want: AnnotationRequest{Profile: "3g.71gb", Count: 2}},
		{ann: map[string]string{AnnotationGPUProfile: "1g.18gb+me"}, want: AnnotationRequest{Profile: "1g.18gb+me"}},
		{ann: map[string]string{AnnotationGPUProfile: "whole", AnnotationRDMA: "true"}, want: AnnotationRequest{Profile: "whole", RDMA: true, HasRDMA: true}},
		{ann: map[string]string{AnnotationRDMA: "false"}, want: AnnotationRequest{HasRDMA: true}},
		{ann: map[string]string{AnnotationGPUProfile: "huge"}, wantErr: AnnotationGPUProfile},
		{ann: map[string]string{AnnotationGPUCount: "0"}, wantErr: AnnotationGPUCount + ": must be an integer from 1 to 64"},
		{ann: map[string]string{AnnotationGPUCount: "65"}, wantErr: AnnotationGPUCount},
		{ann: map[string]string{AnnotationRDMA: "maybe"}, wantErr: AnnotationRDMA + ": must be \"true\" or \"false\""},
	}
	for _, tt := range tests {
		got, err := ParseAnnotations(tt.ann)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v: error %v, want %q", tt.ann, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%v: got %+v, %v; want %+v", tt.ann, got, err, tt.want)
		}
	}
}
